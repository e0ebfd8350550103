"""The simulator: fake NVML and generated /proc files under the real agent code."""
