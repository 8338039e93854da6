# The two commands of the README. Both create .venv with python3.11 and install into it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-long install install-dev sandbox-check browser-check

# A run's child runs under bubblewrap (bwrap) in namespaces of its own; without it runs go ahead
# but are UNSEALED and never ranked. Installed here where apt can (as root), named otherwise.
sandbox-check:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get install -y -qq bubblewrap >/dev/null 2>&1; } || true
	@bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all --unshare-user --disable-userns \
	  --cap-drop ALL --die-with-parent --new-session --as-pid-1 true 2>/dev/null || \
	  echo "warning: bubblewrap cannot make the sandbox's namespaces here, so runs will be" \
	       "UNSEALED (not ranked). Install it (apt-get install bubblewrap) and allow" \
	       "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 or" \
	       "kernel.apparmor_restrict_unprivileged_userns=0)." >&2

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python sandbox-check
	$(BIN)/pip install -q -e .

# The site's browser tests drive headless Chromium (Debian's chromium and chromium-driver):
# installed here where apt can (as root); the tests skip with the reason elsewhere.
browser-check:
	@command -v chromedriver >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
	   (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1)); } || \
	  echo "warning: no chromium-driver here; the site's browser tests will skip" >&2

install-dev: $(BIN)/python sandbox-check browser-check
	$(BIN)/pip install -q -e '.[dev]'

run: install
	$(BIN)/python -m leaderboard

# Every test but those marked long (over about 15 s each); CI runs those too (test-long).
test: install-dev
	$(BIN)/python -m pytest -q -m "not long"

test-long: install-dev
	$(BIN)/python -m pytest -q -m long
