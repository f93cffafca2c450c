"""The fused-MoE kernel configurations vLLM 0.22.0 ships tuned, in bf16 (no `dtype=` in the file name), by
NVIDIA device: `(E, N)` = (routed experts, one expert's width per tensor-parallel rank) of each
`vllm/model_executor/layers/fused_moe/configs/E={E},N={N},device_name={device}.json` in the vLLM 0.22.0
wheel (listed from the GPU bundle: `tar tf` of `.gpu-stage` parts, `grep fused_moe/configs/E=`).

Where a shape has no file for the device, vLLM runs its Triton MoE kernel with a default configuration and
says so in its log ("Using default MoE config. Performance might be sub-optimal!"): measured on an H100
(results/h100-vllm0.22-qwen3-coder-30b-a3b-passive-spread/RUN.md) the expert GEMMs then run slower than a
profile carried from a tuned GPU says. Data only, as `E,N` pairs a device;
`pdexporter.engines.vllm.tuned_moe_config` reads it."""

TUNED_BF16: dict[str, str] = {
    "NVIDIA_A100-SXM4-40GB": "8,1792 8,3584 16,1344",
    "NVIDIA_A100-SXM4-80GB": (
        "1,1792 1,3584 1,7168 1,14336 8,1792 8,2048 8,3584 8,4096 8,7168 16,1344 16,1792 16,2688 16,3584 "
        "16,7168 16,14336 64,640 64,1280 128,192 512,64 512,128"
    ),
    "NVIDIA_A800-SXM4-80GB": "64,640 64,1280 160,192 256,64",
    "NVIDIA_B200": "16,1024 32,1408 64,1408 128,512 128,768 128,1856 512,64 512,128 512,256 512,512 512,672 512,1344",
    "NVIDIA_H100": "16,1024",
    "NVIDIA_H100_80GB_HBM3": (
        "1,3072 8,1792 8,2048 8,3584 8,4096 8,7168 16,1344 16,1792 16,2688 32,1792 62,256 62,512 64,320 "
        "64,640 64,1280 64,1536 72,384 72,768 128,192 128,384 128,512 128,928 128,1856 128,2880 256,512 "
        "512,128 512,256 512,512"
    ),
    "NVIDIA_H20": "64,384 64,768 64,896 64,3072 128,96 128,192 128,384 128,768",
    "NVIDIA_H20-3e": "128,192 128,384 160,192 160,320 512,64 512,128 512,256 512,512",
    "NVIDIA_H200": (
        "8,1792 8,2048 8,3584 8,4096 8,7168 8,14336 16,1024 16,2048 64,320 64,640 64,1280 64,2560 128,96 "
        "128,192 128,384 128,512 128,768 128,1024 512,64 512,128 512,256 512,512"
    ),
    "NVIDIA_L40S": "8,3584 128,928 128,1856",
}
