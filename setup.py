"""The one build step pyproject.toml cannot declare: the wheel carries the repository's top-level
apps/ (the Voila dashboards) and notebooks/ (the teaching notebooks) inside the package, as
bertlab/apps and bertlab/notebooks, where `bertlab serve` and `bertlab notebooks` find them with
importlib.resources wherever pip put it (venv, --user, conda). An editable install reads them
from the checkout instead (bertlab.settings.shipped); MANIFEST.in puts them in the sdist."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED_FOLDERS = ("apps", "notebooks")  # bertlab.settings.SHIPPED_FOLDERS


class BuildPyWithNotebooks(build_py):
    """build_py, then apps/*.ipynb and notebooks/*.ipynb copied to bertlab/<folder>/ in the build."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for folder in SHIPPED_FOLDERS:
            notebooks = sorted(Path(folder).glob("*.ipynb"))
            if not notebooks:
                raise FileNotFoundError(f"no notebooks in {Path(folder).resolve()}: build from a checkout or an sdist")
            target = Path(self.build_lib, "bertlab", folder)
            self.mkpath(str(target))
            for notebook in notebooks:
                self.copy_file(str(notebook), str(target / notebook.name))


setup(cmdclass={"build_py": BuildPyWithNotebooks})
