"""Operations: metrics and health endpoints (over the worker's documented view), logs, process set-up,
signals and the loop watchdog, test-only fault points. Never imports kafka or tools.
"""
