"""Accelerator facts: HardwareSpec and the built-in catalog."""

from servetune.hardware.catalog import get_hardware, hardware_names, load_hardware_file
from servetune.hardware.spec import HardwareSpec

__all__ = ["HardwareSpec", "get_hardware", "hardware_names", "load_hardware_file"]
