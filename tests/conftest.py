"""Markers this test suite uses beyond those pyproject.toml registers."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "sge: needs a running Grid Engine cell (scripts/sge-up)"
    )
