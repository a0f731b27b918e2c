"""feather-sglang's measuring tools, kept apart from the plugin (``feather_sglang``).

``feather-bench-serving`` (``make bench-serving``): SGLang's own ``python -m sglang.bench_serving``
against one server per schedule policy x attention backend, started one at a time.
"""
