"""mmevo: dynamic-kernel ("evolution") vision operators for OpenMMLab."""

import os
import re
from setuptools import find_packages, setup

from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))


def get_version():
    with open(os.path.join(HERE, 'mmevo', 'version.py')) as f:
        return re.search(r"__version__ = '([^']+)'", f.read()).group(1)


def cpu_extension():
    """The C++ CPU kernels of ``mmevo.ops`` (OpenMP-parallel).

    A plain shared library that registers the ``torch.ops.mmevo`` operators
    (``TORCH_LIBRARY``), loaded with ``torch.ops.load_library``: no Python
    module and no Python API, so one build serves every Python version and
    libtorch programs.
    """
    csrc = os.path.join('mmevo', 'ops', 'csrc')
    sources = sorted(
        os.path.join(csrc, f)
        for f in os.listdir(os.path.join(HERE, csrc))
        if f.endswith('.cpp')
    )
    return CppExtension(
        'mmevo._ext',
        sources,
        py_limited_api=True,
        extra_compile_args={'cxx': ['-O3', '-fopenmp', '-std=c++20']},
        extra_link_args=['-fopenmp'],
    )


# The models subclass mmdet's (the backbones its ResNet, the neck and heads
# its FPN / RPNHead / FCNMaskHead), so every task's extra brings mmdet.
DET = ['mmdet>=3.3.0', 'pycocotools']
EXTRAS = {
    'det': DET,
    'seg': [*DET, 'mmsegmentation>=1.2.2', 'ftfy', 'regex'],
    # grad-cam for mmpretrain's tools/visualization/vis_cam.py: 1.4.8 is the
    # last release taking the use_cuda argument that vis_cam.py passes
    'cls': [*DET, 'mmpretrain>=1.2.0', 'grad-cam==1.4.8'],
    'gpu': ['triton>=3.0'],
    # ONNX export (torch.onnx's dynamo exporter needs onnxscript) and
    # onnxruntime for tools/deployment; tested with the pins of
    # tools/setup_env.sh (onnxscript is pre-1.0: its minor releases break)
    'deploy': [
        'onnx>=1.23,<2',
        'onnxruntime>=1.31,<2',
        'onnxscript>=0.7,<0.8',
    ],
    'tests': ['pytest', 'triton>=3.0'],
}
EXTRAS['all'] = sorted({req for reqs in EXTRAS.values() for req in reqs})

setup(
    name='mmevo',
    version=get_version(),
    description='Dynamic-kernel (evolution) vision operators for OpenMMLab: '
    'involution, local self-attention, ELSA, ACmix, dynamic filters',
    long_description=open(os.path.join(HERE, 'README.md')).read(),
    long_description_content_type='text/markdown',
    license='Apache-2.0',
    # the code is Python 3.11 (ruff's target-version), as torch 2.14 allows
    python_requires='>=3.11',
    packages=find_packages(exclude=('configs', 'tools', 'tests', 'docs')),
    include_package_data=True,
    # The ops need torch only, the layers mmengine and mmcv (mmcv.cnn).
    install_requires=['torch>=2.1', 'mmengine>=0.10.0', 'mmcv>=2.0.0'],
    extras_require=EXTRAS,
    ext_modules=[cpu_extension()],
    cmdclass={'build_ext': BuildExtension},
    zip_safe=False,
)
