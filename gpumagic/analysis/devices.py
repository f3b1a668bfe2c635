"""Peak dense TFLOP/s per GPU and dtype, from the vendors' public datasheets (data, not code).

Every figure is the *dense* rate (datasheets quote tensor-core rates "with sparsity" too; those
are twice the dense ones and are never used here), per device as PyTorch sees it.
``fp32`` is the rate of plain FP32 matmuls: CUDA cores on NVIDIA, the FP32 *matrix* (MFMA) rate
on AMD Instinct, which rocBLAS/hipBLASLt use for FP32 GEMMs. ``tf32`` exists from Ampere (NVIDIA)
and CDNA 3 (AMD MI300) on. A dtype a device has no rate for is absent: the MFU is then ``None``.

Names are matched on what ``torch.cuda.get_device_name()`` / the trace's ``deviceProperties``
report (``"NVIDIA H100 80GB HBM3"``, ``"Tesla V100-SXM2-32GB"``, ``"AMD Instinct MI300X VF"``).
A name that matches no entry, or matches one only ambiguously (``"AMD Instinct MI250X/MI250"``),
gets ``None`` — never a guess. GeForce entries match the exact model only (a "Ti", "SUPER", "D"
or laptop variant has other clocks and is not listed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    """One SKU: dense peak TFLOP/s per dtype, and where the figures come from."""

    sku: str
    tflops: dict[str, float]
    source: str


_V100_SXM2 = Peak("V100 SXM2", {"fp32": 15.7, "fp16": 125.0},
                  "NVIDIA Tesla V100 datasheet (2020): SXM2 FP32 15.7, Tensor Performance 125 TFLOPS")
_A100 = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}
_A100_SRC = ("NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS dense "
             "(312/624/624 with sparsity), same for SXM and PCIe")
_H100_SXM = {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}
_H100_SXM_SRC = ("NVIDIA H100 datasheet, H100 SXM: FP32 67, TF32 989*, BF16/FP16 1,979*, FP8 3,958* "
                 "TFLOPS (*with sparsity; dense is half)")
_H_NVL = {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}

#: (name pattern, Peak). The first match wins, so variants come before their family.
PEAKS: tuple[tuple[re.Pattern[str], Peak], ...] = tuple((re.compile(p, re.IGNORECASE), peak) for p, peak in (
    # --- NVIDIA Volta / Turing ---
    (r"V100S", Peak("V100S PCIe", {"fp32": 16.4, "fp16": 130.0},
                    "NVIDIA Tesla V100S datasheet: FP32 16.4, Tensor Performance 130 TFLOPS")),
    (r"V100.*PCIE", Peak("V100 PCIe", {"fp32": 14.0, "fp16": 112.0},
                         "NVIDIA Tesla V100 datasheet (2020): PCIe FP32 14, Tensor Performance 112 TFLOPS")),
    (r"V100.*SXM2", _V100_SXM2),
    (r"V100.*DGXS", Peak("V100 (DGX Station, SXM2)", _V100_SXM2.tflops,
                         "NVIDIA DGX Station datasheet: 4x Tesla V100 SXM2 with NVLink, 500 TFLOPS mixed "
                         "precision in all (= 4 x 125); V100 datasheet SXM2 FP32 15.7")),
    (r"\bT4\b", Peak("T4", {"fp32": 8.1, "fp16": 65.0},
                     "NVIDIA T4 datasheet: FP32 8.1, mixed precision (FP16/FP32) 65 TFLOPS")),
    # --- NVIDIA Ampere ---
    (r"A100", Peak("A100", _A100, _A100_SRC)),
    (r"A10G", Peak("A10G", {}, "AWS-only SKU: NVIDIA publishes no datasheet figures for it; no peak is assumed")),
    (r"\bA10\b", Peak("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
                      "NVIDIA A10 datasheet: FP32 31.2, TF32 62.5 (125*), BF16/FP16 125 (250*) TFLOPS")),
    (r"RTX 3090\s*$", Peak("GeForce RTX 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},
                       "NVIDIA Ampere GA102 GPU architecture whitepaper (RTX 3090): FP32 35.6; "
                       "TF32 35.6; FP16/BF16 tensor with FP32 accumulate 71 TFLOPS dense")),
    (r"RTX 3080\s*$", Peak("GeForce RTX 3080", {"fp32": 29.8, "tf32": 29.8, "bf16": 59.5, "fp16": 59.5},
                       "NVIDIA Ampere GA102 GPU architecture whitepaper (RTX 3080): FP32 29.8; "
                       "TF32 29.8; FP16/BF16 tensor with FP32 accumulate 59.5 TFLOPS dense")),
    # --- NVIDIA Ada ---
    (r"L40S", Peak("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
                   "NVIDIA L40S datasheet: FP32 91.6, TF32 183 (366*), BF16/FP16 362.05 (733*), "
                   "FP8 733 (1,466*) TFLOPS")),
    (r"\bL4\b", Peak("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
                     "NVIDIA L4 datasheet: FP32 30.3; TF32 120*, BF16/FP16 242*, FP8 485* TFLOPS "
                     "(*with sparsity; dense is half)")),
    (r"RTX 4090\s*$", Peak("GeForce RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
                       "NVIDIA Ada GPU architecture whitepaper (RTX 4090): FP32 82.6; TF32 82.6; "
                       "FP16/BF16 with FP32 accumulate 165.2; FP8 with FP32 accumulate 330.3 TFLOPS dense")),
    (r"RTX 4080\s*$", Peak("GeForce RTX 4080", {"fp32": 48.7, "tf32": 48.7, "bf16": 97.5, "fp16": 97.5, "fp8": 194.9},
                       "NVIDIA Ada GPU architecture whitepaper (RTX 4080 16GB): FP32 48.7; TF32 48.7; "
                       "FP16/BF16 with FP32 accumulate 97.5; FP8 194.9 TFLOPS dense")),
    # --- NVIDIA Hopper ---
    (r"H100.*NVL", Peak("H100 NVL", _H_NVL, "NVIDIA H100 datasheet, H100 NVL: FP32 60, TF32 835*, "
                                             "BF16/FP16 1,671*, FP8 3,341* TFLOPS (*with sparsity)")),
    (r"H100.*(PCIE|HBM2e)", Peak("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
                                  "NVIDIA H100 datasheet, H100 PCIe: FP32 51, TF32 756*, BF16/FP16 1,513*, "
                                  "FP8 3,026* TFLOPS (*with sparsity)")),
    (r"H100.*(SXM|HBM3)", Peak("H100 SXM", _H100_SXM, _H100_SXM_SRC)),
    (r"H200.*NVL", Peak("H200 NVL", _H_NVL, "NVIDIA H200 datasheet, H200 NVL: FP32 60, TF32 835*, "
                                             "BF16/FP16 1,671*, FP8 3,341* TFLOPS (*with sparsity)")),
    (r"H200", Peak("H200 SXM", _H100_SXM, "NVIDIA H200 datasheet, H200 SXM: FP32 67, TF32 989*, "
                                          "BF16/FP16 1,979*, FP8 3,958* TFLOPS (*with sparsity)")),
    # --- NVIDIA Blackwell ---
    (r"B200", Peak("B200", {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
                   "NVIDIA HGX B200 specifications (8 GPUs): FP32 600 TFLOPS, TF32 18*, FP16/BF16 36*, "
                   "FP8 72* PFLOPS (*with sparsity); per GPU dense = /8, /2")),
    (r"RTX 5090\s*$", Peak("GeForce RTX 5090", {"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5, "fp8": 419.0},
                       "NVIDIA RTX Blackwell GPU architecture whitepaper (RTX 5090): FP32 104.8; TF32 104.8; "
                       "FP16/BF16 with FP32 accumulate 209.5; FP8 with FP32 accumulate 419 TFLOPS dense")),
    # --- AMD Instinct (CDNA) ---
    (r"MI325X", Peak("MI325X", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
                     "AMD Instinct MI325X datasheet: FP32 matrix 163.4, TF32 653.7, FP16/BF16 1,307.4, "
                     "FP8 2,614.9 TFLOPS dense")),
    (r"MI300X", Peak("MI300X", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
                     "AMD Instinct MI300X datasheet: FP32 matrix 163.4, TF32 653.7, FP16/BF16 1,307.4, "
                     "FP8 2,614.9 TFLOPS dense (a VF, a virtual function of the same GPU, has the same rates)")),
    (r"MI250X/MI250", Peak("MI250X or MI250", {}, "the name does not say which SKU; no peak is assumed")),
    (r"MI250X", Peak("MI250X (one GCD)", {"fp32": 47.85, "bf16": 191.5, "fp16": 191.5},
                     "AMD Instinct MI250X datasheet: FP32 matrix 95.7, FP16/BF16 383 TFLOPS per module of two "
                     "GCDs; PyTorch sees each GCD as one device, so half")),
    (r"MI210", Peak("MI210", {"fp32": 45.3, "bf16": 181.0, "fp16": 181.0},
                    "AMD Instinct MI210 datasheet: FP32 matrix 45.3, FP16/BF16 181 TFLOPS")),
))


def peak_for(device_name: str | None) -> Peak | None:
    """The SKU entry for a device name, or ``None`` when the name is blank or unknown."""
    name = (device_name or "").strip()
    if not name:
        return None
    for pattern, peak in PEAKS:
        if pattern.search(name):
            return peak
    return None


def peak_tflops(device_name: str | None, dtype: str | None) -> tuple[float | None, str | None]:
    """(dense peak TFLOP/s, its source) for a device and dtype; ``(None, None)`` when unknown."""
    peak = peak_for(device_name)
    if peak is None or dtype is None or dtype not in peak.tflops:
        return None, None
    return peak.tflops[dtype], peak.source


#: (name pattern, peak memory bandwidth in TB/s, source). The first match wins, so variants come
#: before their family. A name that matches none gets ``None`` (the roofline then says nothing).
BANDWIDTH: tuple[tuple[re.Pattern[str], float, str], ...] = tuple((re.compile(p, re.IGNORECASE), tbps, src) for p, tbps, src in (
    (r"V100S", 1.134, "NVIDIA Tesla V100S datasheet: memory bandwidth 1,134 GB/s"),
    (r"V100", 0.900, "NVIDIA Tesla V100 datasheet: memory bandwidth 900 GB/s (PCIe and SXM2)"),
    (r"\bT4\b", 0.320, "NVIDIA T4 datasheet: GPU memory bandwidth 320+ GB/s"),
    (r"A100.*80GB.*PCIE", 1.935, "NVIDIA A100 datasheet: A100 80GB PCIe 1,935 GB/s"),
    (r"A100.*80GB", 2.039, "NVIDIA A100 datasheet: A100 80GB SXM 2,039 GB/s"),
    (r"A100", 1.555, "NVIDIA A100 datasheet: A100 40GB 1,555 GB/s"),
    (r"\bA10\b", 0.600, "NVIDIA A10 datasheet: GPU memory bandwidth 600 GB/s"),
    (r"\bL4\b", 0.300, "NVIDIA L4 datasheet: GPU memory bandwidth 300 GB/s"),
    (r"L40S", 0.864, "NVIDIA L40S datasheet: GPU memory bandwidth 864 GB/s"),
    (r"H100.*NVL", 3.9, "NVIDIA H100 datasheet: H100 NVL 3.9 TB/s"),
    (r"H100.*(PCIE|HBM2e)", 2.0, "NVIDIA H100 datasheet: H100 PCIe 2 TB/s"),
    (r"H100", 3.35, "NVIDIA H100 datasheet: H100 SXM 3.35 TB/s"),
    (r"H200", 4.8, "NVIDIA H200 datasheet: GPU memory bandwidth 4.8 TB/s (SXM and NVL)"),
    (r"MI325X", 6.0, "AMD Instinct MI325X datasheet: peak memory bandwidth 6 TB/s"),
    (r"MI300X", 5.3, "AMD Instinct MI300X datasheet: peak memory bandwidth 5.3 TB/s"),
))


def peak_bandwidth(device_name: str | None) -> tuple[float | None, str | None]:
    """(peak memory bandwidth in TB/s, its source) for a device name; ``(None, None)`` when unknown."""
    name = (device_name or "").strip()
    for pattern, tbps, src in BANDWIDTH if name else ():
        if pattern.search(name):
            return tbps, src
    return None, None
