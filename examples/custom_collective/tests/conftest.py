import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")


def pytest_configure(config):
  config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run with -m gpu)")
