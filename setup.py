"""Build glue: cffi compiles the generic core; we add the SIMD variant
objects, each compiled with its own target flags (never -march=native
globally: the scalar fallback must stay runnable on any CPU of the arch)."""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_core  # noqa: E402


class BuildWithSimdVariants(build_ext):
    def _flag_ok(self, flags):
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as f:
                f.write("int main(void){return 0;}\n")
            try:
                self.compiler.compile([src], output_dir=tmp, extra_postargs=flags)
                return True
            except Exception:
                return False

    def build_extension(self, ext):
        if ext.name == "ds4py._ds4core":
            objects = []
            variants = build_core.SIMD_VARIANTS.get(build_core.machine(), [])
            for src, flags in variants:
                if flags and not self._flag_ok(flags):
                    flags = []  # the file compiles to a stub without its macros
                objects += self.compiler.compile(
                    [src], output_dir=self.build_temp, include_dirs=["csrc"],
                    extra_postargs=build_core.BASE_CFLAGS + flags, depends=["csrc/quants/quants.h"])
            ext.extra_objects = list(ext.extra_objects or []) + objects
            # build_ext relinks only when a source or depends entry is newer than
            # the .so; extra_objects are not checked, so list the SIMD sources.
            ext.depends = list(ext.depends or []) + [src for src, _ in variants] + [
                "csrc/quants/quants.h", "csrc/ds4.h"]
        super().build_extension(ext)


setup(cffi_modules=["build_core.py:ffibuilder"], cmdclass={"build_ext": BuildWithSimdVariants})
