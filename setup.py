"""Package discovery that pyproject.toml alone cannot express.

``[tool.setuptools.packages.find]`` only discovers packages by directory name, so the top-level
``rules/`` folder (shipped as ``idivm.rules`` through ``[tool.setuptools.package-dir]``) would be
left out of non-editable installs. Everything else is configured in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["idivm", "idivm.*"]),
        "idivm.rules",
        *(f"idivm.rules.{sub}" for sub in find_packages("rules")),
    ],
)
