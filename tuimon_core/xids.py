"""What an XID means: the one list the agent's event collector and every node rule
read (NVIDIA's Xid catalogue for Ampere and later; the Resolution Bucket decides
critical: an XID after which the GPU or its job must be reset or restarted, or that
points at the hardware)."""

from __future__ import annotations

# Critical: the GPU or its job is in real trouble. 140 (uncorrectable ECC errors the
# driver could not contain by page offlining or row remapping: reset the GPU) is; 121
# (corrected errors on the C2C link to a Grace CPU, no operational impact) is not, a
# warning like any other XID.
CRITICAL_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})

DESCRIPTIONS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after a previous error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "corrected errors on the C2C link",
    140: "uncorrectable ECC error, not contained by page offlining or row remapping",
}


def severity(code: int) -> str:
    return "critical" if code in CRITICAL_XIDS else "warning"


def describe(code: int) -> str:
    return DESCRIPTIONS.get(code, "see NVIDIA's XID catalogue")
