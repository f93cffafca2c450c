{{/* Names, labels and the exporter container, shared by every template. */}}

{{- define "pdexporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pdexporter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pdexporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: name + instance; add a component with pdexporter.componentSelector. */}}
{{- define "pdexporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdexporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pdexporter.labels" -}}
helm.sh/chart: {{ include "pdexporter.chart" . }}
{{ include "pdexporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdexporter
{{- end }}

{{/* (dict "ctx" $ "component" "exporter") -> labels with a component */}}
{{- define "pdexporter.componentLabels" -}}
{{ include "pdexporter.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "pdexporter.componentSelector" -}}
{{ include "pdexporter.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "pdexporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pdexporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference: repository@digest when a digest is set (the tag is then ignored), else
repository:tag. (dict "image" <image values> "name" <its values path> "defaultTag" <tag when
image.tag is empty; none: the tag is required>) */}}
{{- define "pdexporter.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- $tag := .image.tag | default .defaultTag }}
{{- if not $tag }}
{{- fail (printf "%s: set %s.tag or %s.digest" .name .name .name) }}
{{- end }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{- define "pdexporter.image" -}}
{{- include "pdexporter.imageRef" (dict "image" .Values.image "name" "image" "defaultTag" .Chart.AppVersion) }}
{{- end }}

{{/* The Secret holding the engine's API key: exporter.apiKeySecret, else vllm.apiKeySecret (the key
vLLM checks), else none. Renders the PDEXPORTER_API_KEY env entry, or nothing. */}}
{{- define "pdexporter.apiKeyEnv" -}}
{{- $secret := .Values.exporter.apiKeySecret }}
{{- if not $secret.name }}{{ $secret = .Values.vllm.apiKeySecret }}{{ end }}
{{- if $secret.name }}
- name: PDEXPORTER_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret.name }}
      key: {{ $secret.key }}
{{- end }}
{{- end }}

{{/* The port of a URL: the explicit one, else 443 for https and 80 otherwise. */}}
{{- define "pdexporter.urlPort" -}}
{{- $url := urlParse . }}
{{- $port := regexFind ":[0-9]+$" $url.host | trimPrefix ":" }}
{{- if $port }}{{ $port }}{{ else if eq $url.scheme "https" }}443{{ else }}80{{ end }}
{{- end }}

{{/* The chunk sizes the sweep Job runs, one per completion index, as a JSON list: grid.chunk_sizes
of sweep.file (checked against sweep.chunkSizes when both are set), or sweep.chunkSizes. */}}
{{- define "pdexporter.sweepChunkSizes" -}}
{{- $given := list }}
{{- range .Values.sweep.chunkSizes }}{{ $given = append $given (int .) }}{{ end }}
{{- if .Values.sweep.existingConfigMap }}
{{- if not $given }}
{{- fail (printf "sweep.existingConfigMap=%s: the chart cannot read that file, so sweep.chunkSizes must list its grid.chunk_sizes in the file's order (one Job completion each)" .Values.sweep.existingConfigMap) }}
{{- end }}
{{- toJson $given }}
{{- else }}
{{- $file := fromYaml .Values.sweep.file }}
{{- if hasKey $file "Error" }}
{{- fail (printf "sweep.file is not a YAML mapping: %s" (get $file "Error")) }}
{{- end }}
{{- $grid := get $file "grid" }}
{{- $sizes := list }}
{{- if kindIs "map" $grid }}
{{- $raw := get $grid "chunk_sizes" }}
{{- if kindIs "slice" $raw }}
{{- range $raw }}
{{- if not (or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .)) }}
{{- fail (printf "sweep.file: grid.chunk_sizes has %v, not a number" .) }}
{{- end }}
{{- $sizes = append $sizes (int .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $sizes }}
{{- fail "sweep.file: grid.chunk_sizes is missing or empty (the sweep Job runs one completion per chunk size)" }}
{{- end }}
{{- if and $given (ne (toJson $given) (toJson $sizes)) }}
{{- fail (printf "sweep.chunkSizes %s does not match sweep.file's grid.chunk_sizes %s (same sizes, same order: completion I runs the I-th)" (toJson $given) (toJson $sizes)) }}
{{- end }}
{{- toJson $sizes }}
{{- end }}
{{- end }}

{{- define "pdexporter.vllmName" -}}
{{- printf "%s-vllm" (include "pdexporter.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The engine URL a separate exporter Deployment probes: the chart's own vLLM Service when
vllm.enabled, else exporter.target ("" = the embedded engine, whose numbers are modelled). */}}
{{/* The engine's --max-num-batched-tokens, which the exporter cannot read over HTTP. */}}
{{- define "pdexporter.chunkSize" -}}
{{- if .Values.vllm.enabled }}{{ int .Values.vllm.chunkSize }}{{ else }}{{ int .Values.exporter.chunkSize }}{{ end }}
{{- end }}

{{/* D and P of the exporter: exporter.decodeBatchSize / newPrefillTokens, or their old names
(exporter.probeDecode / prefillTokens), still read for one release (NOTES.txt says so). */}}
{{- define "pdexporter.decodeBatchSize" -}}
{{- if hasKey .Values.exporter "probeDecode" }}{{ index .Values.exporter "probeDecode" }}{{ else }}{{ .Values.exporter.decodeBatchSize }}{{ end }}
{{- end }}

{{- define "pdexporter.newPrefillTokens" -}}
{{- if hasKey .Values.exporter "prefillTokens" }}{{ index .Values.exporter "prefillTokens" }}{{ else }}{{ .Values.exporter.newPrefillTokens }}{{ end }}
{{- end }}

{{- define "pdexporter.target" -}}
{{- if .Values.vllm.enabled }}
{{- printf "http://%s:%d" (include "pdexporter.vllmName" .) (int .Values.vllm.port) }}
{{- else }}
{{- .Values.exporter.target }}
{{- end }}
{{- end }}

{{/* Volumes the hardened containers need with a read-only root filesystem. */}}
{{- define "pdexporter.scratchVolumes" -}}
- name: pdexporter-tmp
  emptyDir:
    sizeLimit: {{ .Values.exporter.scratchSizeLimit }}
- name: pdexporter-results
  emptyDir:
    sizeLimit: {{ .Values.exporter.scratchSizeLimit }}
{{- if and .Values.exporter.passive .Values.exporter.liveThresholds.enabled }}
- name: pdexporter-decision
  configMap:
    name: {{ .Values.exporter.liveThresholds.decisionConfigMap.name | quote }}
{{- end }}
{{- end }}

{{/* vLLM's arguments as this chart starts it (vllm.yaml), one list: its container's args, and the exporter's
--engine-command, from which the fit reads the engine's CUDA-graph sizes (docs/engines.md). */}}
{{- define "pdexporter.vllmArgs" -}}
- {{ .Values.vllm.model | quote }}
- --host
- "0.0.0.0"
- --port
- {{ .Values.vllm.port | quote }}
{{- with .Values.vllm.servedModelName }}
- --served-model-name
- {{ . | quote }}
{{- end }}
- {{ printf "--max-num-batched-tokens=%d" (int .Values.vllm.chunkSize) | quote }}
- --enable-chunked-prefill
{{- if .Values.vllm.enablePrefixCaching }}
- --enable-prefix-caching
{{- else }}
- --no-enable-prefix-caching
{{- end }}
- {{ printf "--gpu-memory-utilization=%v" .Values.vllm.gpuMemoryUtilization | quote }}
{{- if .Values.vllm.maxModelLen }}
- {{ printf "--max-model-len=%d" (int .Values.vllm.maxModelLen) | quote }}
{{- end }}
{{- if .Values.vllm.iterationDetails }}
- --enable-logging-iteration-details
{{- end }}
{{- if .Values.vllm.enforceEager }}
- --enforce-eager
{{- end }}
{{- range .Values.vllm.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* `vllm serve` and those arguments as one command line, each word single-quoted (the exporter splits it
as a shell would: a --compilation-config JSON in vllm.extraArgs stays one word). */}}
{{- define "pdexporter.vllmCommand" -}}
{{- $words := list "vllm" "serve" -}}
{{- range fromYamlArray (include "pdexporter.vllmArgs" .) -}}
{{- $words = append $words (squote (toString .)) -}}
{{- end -}}
{{- join " " $words -}}
{{- end }}

{{/*
The exporter container. Used by the exporter Deployment, by the vLLM Deployment in sidecar mode,
and by a parent chart that runs its own vLLM:
  containers:
    - name: vllm
      ...
    {{- include "pdexporter.sidecarContainer" .Subcharts.pdexporter | nindent 4 }}
  volumes:
    {{- include "pdexporter.scratchVolumes" .Subcharts.pdexporter | nindent 4 }}
In the sidecar forms the target is the vLLM container on localhost (override with exporter.sidecarTarget).
*/}}
{{- define "pdexporter.exporterContainer" -}}
{{- $target := .target -}}
{{- $chunkSize := .chunkSize -}}
{{- with .ctx }}
- name: exporter
  image: {{ include "pdexporter.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - run
    {{- if .Values.exporter.passive }}
    - --passive
    - --traces-listen
    - {{ printf "0.0.0.0:%d" (int .Values.exporter.tracesPort) | quote }}
    {{- if .Values.exporter.liveThresholds.enabled }}
    - --decision
    - {{ printf "/etc/pdexporter/decision/%s" .Values.exporter.liveThresholds.decisionConfigMap.key | quote }}
    - --threshold-every
    - {{ .Values.exporter.liveThresholds.every | quote }}
    {{- end }}
    {{- end }}
    - --decode-batch-size
    - {{ include "pdexporter.decodeBatchSize" . | quote }}
    - --listen
    - {{ printf "0.0.0.0:%d" (int .Values.exporter.port) | quote }}
    {{- with $target }}
    - --target
    - {{ . | quote }}
    {{- end }}
    - --chunk-size
    - {{ $chunkSize | quote }}
    {{- with .Values.exporter.model }}
    - --model
    - {{ . | quote }}
    {{- end }}
    {{- if not .Values.exporter.passive }}
    - --inject-every
    - {{ .Values.exporter.injectEvery | default "off" | quote }}
    {{- end }}
    - --new-prefill-tokens
    - {{ include "pdexporter.newPrefillTokens" . | quote }}
    {{- if .Values.vllm.enabled }}
    - --engine-command
    - {{ include "pdexporter.vllmCommand" . | quote }}
    {{- end }}
    {{- range .Values.exporter.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  ports:
    - name: metrics
      containerPort: {{ .Values.exporter.port }}
      protocol: TCP
    {{- if .Values.exporter.passive }}
    - name: traces
      containerPort: {{ .Values.exporter.tracesPort }}
      protocol: TCP
    {{- end }}
  env:
    - name: HOME
      value: /tmp
    {{- with include "pdexporter.apiKeyEnv" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- if .Values.exporter.metricsTokenSecret.name }}
    - name: PDEXPORTER_METRICS_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ .Values.exporter.metricsTokenSecret.name | quote }}
          key: {{ .Values.exporter.metricsTokenSecret.key | quote }}
    {{- end }}
    {{- if and .Values.exporter.passive .Values.exporter.tracesTokenSecret.name }}
    - name: PDEXPORTER_TRACES_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ .Values.exporter.tracesTokenSecret.name | quote }}
          key: {{ .Values.exporter.tracesTokenSecret.key | quote }}
    {{- end }}
    {{- with .Values.exporter.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.exporter.livenessProbe }}
  livenessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.exporter.readinessProbe }}
  readinessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  {{- with .Values.exporter.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: pdexporter-tmp
      mountPath: /tmp
    - name: pdexporter-results
      mountPath: /results
    {{- if and .Values.exporter.passive .Values.exporter.liveThresholds.enabled }}
    - name: pdexporter-decision
      mountPath: /etc/pdexporter/decision
      readOnly: true
    {{- end }}
{{- end }}
{{- end }}

{{/* For a parent chart's vLLM pod: the exporter probing vLLM on localhost. */}}
{{- define "pdexporter.sidecarContainer" -}}
{{- $target := .Values.exporter.sidecarTarget | default (printf "http://127.0.0.1:%d" (int .Values.vllm.port)) -}}
{{- include "pdexporter.exporterContainer" (dict "ctx" . "target" $target "chunkSize" (int .Values.vllm.chunkSize)) }}
{{- end }}
