# rlchain developer commands. `make train` and `make test` each install what
# they need first; `.ci/run` (CI) runs `make test`.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install install-core train test lint docs bench help

help:
	@echo "make train   install what the main job needs (rlchain, no extra), then train GRPO on push_cube (the main job)"
	@echo "make test    install every extra, add a Vulkan driver where none is (.ci/vulkan), then ruff, the strict docs build and the test suite"
	@echo "make lint    ruff: the code is formatted (ruff format --check) and passes its lint rules (ruff check)"
	@echo "make docs    build the docs site strictly into a temporary directory (mkdocs serve to read it)"
	@echo "make bench   install, then run the speed benchmarks under benchmarks/"

# torch first: on a machine without it, `pip install torch==2.13.0` takes the
# local CPU wheel. A torch that is already installed (CPU or CUDA) is left alone:
# its version is a constraint of the install, so that no extra's requirement (mjlab's
# torchvision) can replace it with another build. $(1): the extras, e.g. [dev].
define pip_install
	@$(PYTHON) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" || $(PIP) install --quiet torch==2.13.0
	@pinned=$$(mktemp) && $(PYTHON) -c "from importlib.metadata import version; print('torch==' + version('torch').split('+')[0])" > "$$pinned" \
		&& $(PIP) install --quiet --disable-pip-version-check -e ".$(1)" -c "$$pinned"; \
		status=$$?; rm -f "$$pinned"; exit $$status
endef

# Everything the tests use: every extra (the simulators, Optuna, W&B, video, ONNX, the peers, the docs site).
install:
	$(call pip_install,[dev])

# What the main job needs: rlchain and its own requirements (torch, Hydra, tensordict, gymnasium, ...), no extra.
install-core:
	$(call pip_install,)

# `python -m rlchain` is rlchain-train, run by the Python that `install` installed into (activated or not).
train: install-core
	$(PYTHON) -m rlchain algorithm=grpo env=push_cube

# .ci/vulkan gives ManiSkill's simulator a Vulkan device (Mesa's CPU driver on a Debian 12 machine run as root
# that has none; elsewhere one line saying what is missing, and the ManiSkill tests skip). Then ruff and the docs
# (seconds), so that pytest's summary stays the last line. Two pytest workers, one per core of the 2-core CI
# machine: most tests wait on the processes they start.
test: install
	.ci/vulkan
	$(MAKE) --no-print-directory lint PYTHON=$(PYTHON)
	$(MAKE) --no-print-directory docs PYTHON=$(PYTHON)
	$(PYTHON) -m pytest -n 2

# The rules are in pyproject.toml ([tool.ruff]); `ruff format .` and `ruff check --fix .` mend what they can.
lint:
	$(PYTHON) -m ruff format --check --quiet .
	$(PYTHON) -m ruff check --quiet .

# The strict build fails on a broken link or anchor, a missing included file, or a docstring the API reference
# cannot read; the configuration reference is generated from the schemas by docs/hooks/settings_reference.py.
docs:
	@site=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --site-dir "$$site"; \
		status=$$?; rm -rf "$$site"; exit $$status

bench: install
	$(PYTHON) benchmarks/env_throughput.py
	$(PYTHON) benchmarks/train_push_cube.py
	$(PYTHON) benchmarks/sweep_throughput.py
	$(PYTHON) benchmarks/gym_suite.py
