# The two commands of the README. Both create .venv with python3.11 and install into it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install install-dev sandbox-check

# A run's child needs unprivileged user namespaces (util-linux unshare); without them runs go
# ahead but are UNSEALED and never ranked.
sandbox-check:
	@unshare --user --map-root-user --net --ipc --pid --fork --kill-child --mount-proc true 2>/dev/null || \
	  echo "warning: unshare cannot make the sandbox's namespaces here, so runs will be UNSEALED" \
	       "(not ranked). Install util-linux (apt-get install util-linux) and allow unprivileged" \
	       "user namespaces (sysctl kernel.unprivileged_userns_clone=1 or" \
	       "kernel.apparmor_restrict_unprivileged_userns=0)." >&2

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python sandbox-check
	$(BIN)/pip install -q -e .

install-dev: $(BIN)/python sandbox-check
	$(BIN)/pip install -q -e '.[dev]'

run: install
	$(BIN)/python -m leaderboard

test: install-dev
	$(BIN)/python -m pytest -q
