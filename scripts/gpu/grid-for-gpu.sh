# Sourced by seed-grid-h200.sh and validation.sh (not run alone). grid_for_gpu FILE DIR prints the sweep file to
# run: FILE itself, or on another GPU a copy in DIR with two things changed, nothing else (the flags measured, the
# grid and the protocol stay): GPU (the records' `gpu`, default H200) and MAX_MODEL_LEN (vLLM's, default 200000;
# 65536 on an H100, whose 80 GB hold ~110K tokens of KV cache beside the weights). The differences go to stderr.
grid_for_gpu() {
  local file=$1 dir=$2
  if [ -z "${GPU:-}${MAX_MODEL_LEN:-}" ]; then echo "$file"; return 0; fi
  local copy; copy=$dir/$(basename "$file" .yaml)-${GPU:-H200}.yaml
  sed -e "s/^gpu: H200$/gpu: ${GPU:-H200}/" -e "s/--max-model-len 200000/--max-model-len ${MAX_MODEL_LEN:-200000}/" \
    "$file" > "$copy"
  diff "$file" "$copy" >&2
  echo "$copy"
}
