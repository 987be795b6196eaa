"""The verdict: records -> summary (analysis per candidate and suite) -> gates -> report."""
