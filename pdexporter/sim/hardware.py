"""GPUs the step-time model knows: datasheet figures, marked as such. Pure data.

A projected profile (`pdexporter.sim.modelconfig.profile_from_config`) takes its GPU from here:
dense tensor-core peaks (BF16 and FP8, without sparsity), HBM bandwidth and capacity, and the
one-way bandwidth of the link between two GPUs of one host (NVLink, or PCIe where the card has no
NVLink). Every figure is the vendor's datasheet value except where `measured` says otherwise
(the H200's memory as nvidia-smi reports it and its large-GEMM rate, both measured on the GPU
machine of results/h200-vllm0.22-qwen3-coder-30b-a3b). A datasheet peak is not what kernels reach:
the profile's efficiencies (fractions of these peaks) carry that, calibrated on the H200 and
carried over to the others as a hypothesis (`calibration: projected`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdexporter.errors import ConfigError
from pdexporter.sim.profile import GpuSpec

__all__ = ["GPUS", "GpuDatasheet", "gpu_datasheet"]


@dataclass(frozen=True)
class GpuDatasheet:
    name: str
    memory_gib: float  # usable device memory (GiB)
    bf16_tflops: float  # dense, no sparsity
    fp8_tflops: float | None  # dense, no sparsity; None: no FP8 tensor cores
    hbm_tb_s: float
    link: str  # what joins two GPUs of one host
    link_gb_s: float  # one direction
    source: str
    measured: tuple[str, ...] = ()  # fields that are measurements, not datasheet figures
    matmul_tflops: float | None = None  # a large BF16 GEMM, measured

    def spec(self) -> GpuSpec:
        return GpuSpec(
            name=self.name,
            memory_gib=self.memory_gib,
            peak_dense_bf16_tflops=self.bf16_tflops,
            peak_dense_fp8_tflops=self.fp8_tflops,
            measured_matmul_tflops=self.matmul_tflops,
            hbm_bandwidth_tb_s=self.hbm_tb_s,
            source=self.describe(),
        )

    def describe(self) -> str:
        measured = f"; measured: {', '.join(self.measured)}" if self.measured else ""
        return f"datasheet: {self.source}{measured}"


GPUS: dict[str, GpuDatasheet] = {
    g.name: g
    for g in (
        GpuDatasheet(
            "H200",
            140.4,
            989.0,
            1979.0,
            4.8,
            "NVLink 4, same host",
            450.0,
            "NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB HBM3e, 4.8 TB/s, BF16 1,979 / FP8 3,958 "
            "TFLOPS with sparsity, half without; NVLink 900 GB/s)",
            ("memory_gib: 143,771 MiB by nvidia-smi", "matmul_tflops: a large BF16 GEMM, 790 TFLOPS"),
            790.0,
        ),
        GpuDatasheet(
            "H100",
            79.6,
            989.0,
            1979.0,
            3.35,
            "NVLink 4, same host",
            450.0,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 80 GB HBM3, 3.35 TB/s, BF16 1,979 / FP8 3,958 "
            "TFLOPS with sparsity, half without; NVLink 900 GB/s); memory: 81,559 MiB as nvidia-smi shows "
            "an 80 GB part",
        ),
        GpuDatasheet(
            "H20",
            95.6,
            148.0,
            296.0,
            4.0,
            "NVLink 4, same host",
            450.0,
            "NVIDIA H20 specifications (96 GB HBM3, 4.0 TB/s, BF16 148 / FP8 296 TFLOPS dense; NVLink "
            "900 GB/s)",
        ),
        GpuDatasheet(
            "A100",
            80.0,
            312.0,
            None,
            2.039,
            "NVLink 3, same host",
            300.0,
            "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB: HBM2e 2,039 GB/s, BF16 312 TFLOPS dense, "
            "no FP8; NVLink 600 GB/s)",
        ),
        GpuDatasheet(
            "L40S",
            45.0,
            362.05,
            733.0,
            0.864,
            "PCIe Gen4 x16, no NVLink",
            32.0,
            "NVIDIA L40S datasheet (48 GB GDDR6 with ECC, 864 GB/s, BF16 362.05 / FP8 733 TFLOPS dense "
            "(733 / 1,466 with sparsity); PCIe Gen4 x16 64 GB/s both directions)",
        ),
    )
}


def gpu_datasheet(name: str) -> GpuDatasheet:
    """A known GPU by name (case-insensitive; "H100-SXM", "h200" and the like are accepted)."""
    key = name.strip().upper().replace("NVIDIA", "").replace(" ", "").replace("-SXM", "").replace("SXM", "")
    key = {"A100-80GB": "A100", "A10080GB": "A100"}.get(key, key)
    if key not in GPUS:
        raise ConfigError(f"--gpu {name!r}: unknown GPU; known: {', '.join(GPUS)}")
    return GPUS[key]
