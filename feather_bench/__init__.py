"""feather-sglang's tooling, kept apart from the plugin (``feather_sglang``).

``feather-ab`` (:mod:`feather_bench.ab`): every schedule policy x attention backend on one
workload. ``feather-bench-serving``: SGLang's own ``python -m sglang.bench_serving`` against one
server per configuration. ``feather-bench-scale`` and :mod:`feather_bench.overhead`: the
scheduling cost per pass. :mod:`feather_bench.workloads`: the built-in workloads and workload
files. :mod:`feather_bench.tools`: the real server and engine helpers the tools and the
end-to-end tests share.
"""
