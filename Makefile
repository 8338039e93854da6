# The two commands of the README. Both create .venv with python3.11 and install into it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install install-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-dev: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'

run: install
	$(BIN)/python -m leaderboard

test: install-dev
	$(BIN)/python -m pytest -q
