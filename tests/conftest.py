"""Suite-wide pytest hooks.

``./dev test`` runs the suite once per environment (torch 2.9 + torch_xla, newest torch) and prints one closing
line over all of them: each run appends its counts to the file named by ``FUNCOLL_COUNTS``.
"""

import os

import torch


def pytest_report_header(config):
    from importlib import metadata

    try:  # the version only: importing torch_xla here would change what the tests see
        xla = "torch_xla " + metadata.version("torch_xla")
    except metadata.PackageNotFoundError:
        xla = "no torch_xla"
    return f"funcoll environment {os.environ.get('FUNCOLL_ENV', '?')}: torch {torch.__version__}, {xla}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = os.environ.get("FUNCOLL_COUNTS")
    if not path:
        return
    stats = terminalreporter.stats

    def n(*keys):  # as pytest's own closing line counts them
        return sum(len(stats.get(k, [])) for k in keys)

    with open(path, "a") as f:
        f.write(f"{n('passed')} {n('failed', 'error')} {n('skipped')}\n")
