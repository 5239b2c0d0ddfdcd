"""Small click commands of the ``kvtrace`` CLI that read traces (inspect, recover)."""
