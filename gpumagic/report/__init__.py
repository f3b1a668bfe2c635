"""The report layer: what the user holds (Report, Finding) and its text render."""

from gpumagic.report.model import Evidence, Finding, Fix, Report, Window

__all__ = ["Evidence", "Finding", "Fix", "Report", "Window"]
