"""Where the course lives online. To move the course, change REPO here; then
``pytest tests/test_repo_consistency.py`` names every notebook badge and install cell that
still points elsewhere (each must equal :func:`colab_url` / :func:`pip_spec`)."""

REPO = "codex-lab/codex-lab"  # GitHub owner/name
BRANCH = "main"


def github_url() -> str:
    """https URL of the repository."""
    return f"https://github.com/{REPO}"


def colab_url(notebook: str) -> str:
    """Colab link that opens ``notebook`` (a path like notebooks/00_tour.ipynb) from GitHub."""
    return f"https://colab.research.google.com/github/{REPO}/blob/{BRANCH}/{notebook}"


def binder_url() -> str:
    """Binder link that builds environment.yml and opens JupyterLab."""
    return f"https://mybinder.org/v2/gh/{REPO}/{BRANCH}?urlpath=lab"


def pip_spec() -> str:
    """What Colab's first cell installs."""
    return f"git+{github_url()}@{BRANCH}"
