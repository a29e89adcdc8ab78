"""Build glue: cffi compiles the generic core; we add the SIMD variant
objects, each compiled with its own target flags (never -march=native
globally: the scalar fallback must stay runnable on any CPU of the arch)."""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
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


class BuildPyWithGpuSources(build_py):
    """A wheel carries the C sources the GPU backend plugin is compiled from
    on first use (ds4py/gpu_backend.py, gpu/tools/build_plugin.py) under
    ds4py/_native/; an editable install reads them from the checkout."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        sys.path.insert(0, os.path.join(ROOT, "gpu", "tools"))
        import build_plugin

        dst = os.path.join(self.build_lib, "ds4py", "_native")
        for rel in build_plugin.source_files(ROOT):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            self.copy_file(os.path.join(ROOT, rel), os.path.join(dst, rel))


setup(cffi_modules=["build_core.py:ffibuilder"],
      cmdclass={"build_ext": BuildWithSimdVariants, "build_py": BuildPyWithGpuSources})
