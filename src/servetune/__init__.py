"""servetune: from "model + GPU + SLO" to a proven, recorded serving config."""

__version__ = "0.1.0"

__all__ = ["__version__"]
