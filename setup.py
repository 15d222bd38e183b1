"""The one thing pyproject.toml cannot say: the optional C accelerator.

``store._accel._textscan`` (store/_accel/_textscan.c) scans log text -- its line count,
whether it is ASCII, holds a carriage return or may hold an overlong line --
in one SIMD pass. It is ``optional``: without a C compiler the install goes
on, and store._accel falls back to the bytes methods (the same results, for
about 4x the CPU of those checks per logged byte). Everything else is in
pyproject.toml (https://setuptools.pypa.io/en/latest/userguide/ext_modules.html).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "store._accel._textscan",
            sources=["store/_accel/_textscan.c"],
            optional=True,
            # -O2 after Python's own -O3: gcc vectorises the lane loop at both,
            # but measured 2-3x faster at -O2 (byte adds instead of widening).
            extra_compile_args=["-O2"],
        )
    ]
)
