"""jaxll's tools, apart from the library (``import jaxll`` loads none of them):

- ``jaxll.tools.testing``: virtual ranks (N ranks of one group on one GPU)
  and the speed-of-light probes, for testing and tuning kernels on one GPU;
- ``jaxll.tools.launch``: N local processes joined by ``jax.distributed``;
- ``jaxll.tools.bench``: the benchmark (``python -m jaxll.tools.bench``);
- ``jaxll.tools.profile``: device time per kernel from JAX's profiler.
"""
