# IdeGym — the README's two commands are `make demo` and `make test`.
# Everything they need is installed here, so they work on a fresh machine.

PYTHON     ?= python3.11
VENV       := .venv
CLIENT_VENV:= .venv-client
PY         := $(VENV)/bin/python
AS_USER    := sandbox_server/native/idegym-as-user
SPAWNER    := sandbox_server/native/idegym-spawner
REMOUNT    := control_plane/backends/local/native/idegym-remount
PIP        := $(PY) -m pip --quiet --disable-pip-version-check
EXTRAS     ?= dev,kubernetes,openenv,ray,trl,skyrl,mcp,mini-swe-agent
HARBOR_VENV:= .venv-harbor
# The framework plug-ins whose pins clash with the main venv's (docs/integrations.md): a venv each.
NEMO_VENV  := .venv-nemo-gym
VERL_VENV  := .venv-verl
VERIFIERS_VENV := .venv-verifiers
# uv installs the venvs' packages: on a fresh machine it made the three venvs in 60 s where pip
# took 175 s, with the same versions (pip remains in each venv, and installs torch below).
UV_VENV    := .venv-uv
UV         := $(UV_VENV)/bin/uv
# --compile-bytecode: uv, unlike pip, writes no bytecode by default, and sandbox servers run these
# packages from a read-only bind, so each one compiled aiohttp and pydantic again at every start
# (make test took 992 s without it; see the closing note of session 6).
UV_PIP     := $(UV) pip install --quiet --compile-bytecode --python
# torch is the CPU build that lies on disk where pip's find-links point (PIP_FIND_LINKS): uv
# installs it from there in 35 s where pip took 82 (the same wheel). Without such a location pip
# installs it (it reads its own configuration; uv would take PyPI's multi-GB CUDA build).
TORCH      := torch==2.13.0
TORCH_FROM := $(foreach link,$(PIP_FIND_LINKS),--find-links $(link))
install_torch = $(if $(TORCH_FROM),$(UV_PIP) $(1) $(TORCH_FROM) $(TORCH),$(1) -m pip --quiet --disable-pip-version-check install $(TORCH))
# The venvs are made in parallel; setuptools writes idegym.egg-info in this tree at every editable
# install, so those take turns.
EDITABLE   := flock $(CURDIR)/.editable-install.lock
HARBOR_REQ := $(shell grep -o 'harbor==[0-9.]*' pyproject.toml | head -n1)
# The published idegym-client 0.13.1 needs Python >= 3.12; pyenv keeps one off PATH.
PYTHON312  ?= $(shell command -v python3.12 >/dev/null 2>&1 && python3.12 -c pass 2>/dev/null && echo python3.12 || ls -1d $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 2>/dev/null | head -n1)

.PHONY: help bytecode test-bytecode lint typecheck demo test test-fast test-deps strace test-all test-slow bench system-deps net-deps venv demo-venv client-venv harbor-venv nemo-gym-venv verl-venv verifiers-venv gym-versions native clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

system-deps:  ## Debian packages: bubblewrap (sandbox isolation), mmdebstrap + buildah (OCI images), util-linux, iproute2
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (apt-get)"; \
	    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null)) || \
	     echo "WARNING: could not install bubblewrap; sandboxes will run WITHOUT isolation"; \
	  else echo "WARNING: bwrap not found and apt-get unavailable; sandboxes will run WITHOUT isolation"; fi; \
	fi
	@# mkfs.ext4 bounds each sandbox's writes (its layers are an ext4 image of their own)
	@command -v mkfs.ext4 >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get install -y -q e2fsprogs >/dev/null 2>&1; } || \
	  echo "WARNING: no mkfs.ext4 (e2fsprogs): sandbox storage is NOT bounded by default"
	@# OCI images (docs/images.md): Debian bases from mmdebstrap, Dockerfile builds with buildah; the
	@# registry (docker-registry) serves the tests of `idegym images push` and registry mirrors.
	@missing=""; for tool in mmdebstrap:mmdebstrap buildah:buildah docker-registry:docker-registry; do \
	  command -v $${tool%%:*} >/dev/null 2>&1 || missing="$$missing $${tool#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing (apt-get)"; \
	    (apt-get install -y -q $$missing >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $$missing >/dev/null)) || \
	     echo "WARNING: could not install$$missing; OCI image builds (Dockerfiles, debian/python bases) will fail"; \
	  else echo "WARNING:$$missing not found and apt-get unavailable; OCI image builds will fail"; fi; \
	fi

$(UV):
	@test -x $(UV_VENV)/bin/python || $(PYTHON) -m venv $(UV_VENV)
	@$(UV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv==0.13.9

$(VENV)/.stamp: pyproject.toml | $(UV)
	@echo "creating $(VENV) and installing idegym[$(EXTRAS)] (first run takes a minute or two)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(UV_PIP) $(PY) --upgrade pip setuptools wheel
	@# RLlib and TRL need torch: the CPU build first, which the extras' install then keeps.
	@case ",$(EXTRAS)," in *,ray,*|*,trl,*) $(call install_torch,$(PY)) ;; esac
	@$(EDITABLE) $(UV_PIP) $(PY) -e '.[$(EXTRAS)]'
	@touch $@ $(VENV)/.stamp-demo

# The demo needs only the base install: no torch, Ray or Kubernetes client (those are for the tests).
$(VENV)/.stamp-demo: pyproject.toml | $(UV)
	@echo "creating $(VENV) and installing idegym (the demo's dependencies only)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(UV_PIP) $(PY) --upgrade pip setuptools wheel
	@$(EDITABLE) $(UV_PIP) $(PY) -e .
	@touch $@

# Sandboxes allowed the network get their own network namespace with user-mode networking.
net-deps: system-deps  ## Debian packages slirp4netns and iptables (networking for sandboxes allowed the network)
	@missing=""; for tool in slirp4netns:slirp4netns iptables-restore:iptables; do \
	  command -v $${tool%%:*} >/dev/null 2>&1 || missing="$$missing $${tool#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing (apt-get)"; \
	    (apt-get install -y -q $$missing >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $$missing >/dev/null)) || \
	     echo "WARNING: could not install$$missing; sandboxes with network will not start"; \
	  else echo "WARNING:$$missing not found and apt-get unavailable; sandboxes with network will not start"; fi; \
	fi

venv: system-deps net-deps $(VENV)/.stamp native  ## create .venv with everything the tests need

demo-venv: system-deps $(VENV)/.stamp-demo native  ## create .venv with what the demo needs

native: $(AS_USER) $(SPAWNER) $(REMOUNT)  ## the small C programs (each optional: see below)

# A small C program of the project, static where the libc allows; $(1) says what the project
# does without it (each is optional).
define build_native
	@mkdir -p $(@D)
	@if command -v cc >/dev/null 2>&1; then \
	  cc -O2 -static -Wall -Wextra -o $@ $< 2>/dev/null || cc -O2 -Wall -Wextra -o $@ $< || \
	    echo "WARNING: could not build $@; $(1)"; \
	else echo "WARNING: no C compiler (apt-get install gcc libc6-dev); $(1)"; fi
endef

# The tools' switch to the tool user (sandbox_server/native/as_user.c); without a C compiler the
# server uses setpriv instead (~1 ms more a call).
$(AS_USER): sandbox_server/native/as_user.c
	$(call build_native,tools switch users with setpriv (slower))

# The tool user's spawner (sandbox_server/native/spawner.c, the server's side in spawner.py): it
# starts the tool user's tools, being that user already. Without it tools start the long way
# (through the helper above; benchmarks/tool_call.py measures both).
$(SPAWNER): sandbox_server/native/spawner.c
	$(call build_native,tools of the tool user start the long way (slower))

# The control plane's remount of a fork's warm children (control_plane/backends/local/native/remount.c, the
# caller in control_plane/backends/local/adopt.py): without it each is remounted in Python (slower).
$(REMOUNT): control_plane/backends/local/native/remount.c
	$(call build_native,a fork's warm children are remounted in Python (slower))

$(CLIENT_VENV)/.stamp: | $(UV)
	@test -n "$(PYTHON312)" || { echo "ERROR: Python 3.12 not found (needed for the published idegym-client)"; exit 1; }
	@echo "creating $(CLIENT_VENV) with idegym-client==0.13.1 on $(PYTHON312)"
	@test -x $(CLIENT_VENV)/bin/python || $(PYTHON312) -m venv $(CLIENT_VENV)
	@$(UV_PIP) $(CLIENT_VENV)/bin/python idegym-client==0.13.1 diff-match-patch==20241021
	@touch $@

client-venv: $(CLIENT_VENV)/.stamp  ## Python 3.12 venv with the published idegym-client

# Harbor needs Python >= 3.12: its own venv with Harbor and this package (editable) for its CLI.
$(HARBOR_VENV)/.stamp: pyproject.toml | $(UV)
	@test -n "$(PYTHON312)" || { echo "ERROR: Python 3.12 not found (needed for harbor)"; exit 1; }
	@echo "creating $(HARBOR_VENV) with idegym[harbor] on $(PYTHON312)"
	@test -x $(HARBOR_VENV)/bin/python || $(PYTHON312) -m venv $(HARBOR_VENV)
	@$(UV_PIP) $(HARBOR_VENV)/bin/python '$(HARBOR_REQ)'
	@$(EDITABLE) $(UV_PIP) $(HARBOR_VENV)/bin/python -e '.[harbor]'
	@touch $@

harbor-venv: $(HARBOR_VENV)/.stamp  ## Python 3.12 venv with Harbor and idegym[harbor]

# NeMo Gym 0.4.0 needs Python >= 3.12 (0.5 and later >= 3.13.14, which these machines lack) and pins
# openai and mcp below the main venv's; mini-swe-agent is there for its sandbox-backed agent.
$(NEMO_VENV)/.stamp: pyproject.toml | $(UV)
	@test -n "$(PYTHON312)" || { echo "ERROR: Python 3.12 not found (needed for nemo-gym)"; exit 1; }
	@echo "creating $(NEMO_VENV) with idegym[nemo-gym,mini-swe-agent] on $(PYTHON312)"
	@test -x $(NEMO_VENV)/bin/python || $(PYTHON312) -m venv $(NEMO_VENV)
	@$(EDITABLE) $(UV_PIP) $(NEMO_VENV)/bin/python -e '.[nemo-gym,mini-swe-agent]'
	@touch $@

nemo-gym-venv: $(NEMO_VENV)/.stamp  ## Python 3.12 venv with NeMo Gym and idegym[nemo-gym]

# verl pins transformers below TRL's; torch is the CPU build on disk, as in the main venv.
$(VERL_VENV)/.stamp: pyproject.toml | $(UV)
	@echo "creating $(VERL_VENV) with idegym[verl]"
	@test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	@$(UV_PIP) $(VERL_VENV)/bin/python --upgrade pip setuptools wheel
	@$(call install_torch,$(VERL_VENV)/bin/python)
	@$(EDITABLE) $(UV_PIP) $(VERL_VENV)/bin/python -e '.[verl]'
	@touch $@

verl-venv: $(VERL_VENV)/.stamp  ## venv with verl and idegym[verl]

# verifiers pins mcp 2.0.0 (the main venv has 2.3.0 for the MCP server).
$(VERIFIERS_VENV)/.stamp: pyproject.toml | $(UV)
	@echo "creating $(VERIFIERS_VENV) with idegym[verifiers]"
	@test -x $(VERIFIERS_VENV)/bin/python || $(PYTHON) -m venv $(VERIFIERS_VENV)
	@$(EDITABLE) $(UV_PIP) $(VERIFIERS_VENV)/bin/python -e '.[verifiers]'
	@touch $@

verifiers-venv: $(VERIFIERS_VENV)/.stamp  ## venv with verifiers (its OpenEnv taskset) and idegym[verifiers]

# Gymnasium at both ends of the supported range, beside the venv's own (Ray pins 1.2.2): the tests
# run the env against each by putting one of these first on PYTHONPATH.
GYM_VERSIONS := 1.0.0 1.4.0
.gym-versions/%/.stamp: | $(UV)
	@$(UV_PIP) $(PY) --no-deps --target .gym-versions/$* gymnasium==$*
	@touch $@

gym-versions: $(foreach v,$(GYM_VERSIONS),.gym-versions/$(v)/.stamp)

# Our own packages' bytecode, written ahead: PYTHONDONTWRITEBYTECODE (set on these machines) would
# otherwise make every control plane, CLI and worker process compile them again.
# Only the packages' own modules: the task trees under idegym_env/tasks must stay as shipped.
bytecode:
	@$(PY) -c 'import compileall, pathlib, sys; walk = lambda d: all([compileall.compile_dir(str(d), maxlevels=0, quiet=1), *[walk(s) for s in d.iterdir() if (s / "__init__.py").is_file()]]); sys.exit(not all([walk(pathlib.Path(p)) for p in sys.argv[1:]]))' control_plane idegym_env sandbox_server

demo: demo-venv bytecode  ## run real episodes end to end on the embedded local control plane
	@$(VENV)/bin/idegym demo

lint: venv  ## ruff over the whole repository (configured in pyproject.toml)
	@$(VENV)/bin/ruff check .

# The type checker and the stubs it needs, pinned here (not an extra: nothing else installs them).
TYPECHECK_REQS := mypy==2.4.1 types-pyyaml==6.0.12.20261113

$(VENV)/.stamp-typecheck: Makefile | $(VENV)/.stamp
	@$(UV_PIP) $(PY) $(TYPECHECK_REQS)
	@touch $@

typecheck: $(VENV)/.stamp-typecheck  ## mypy (pyproject.toml: strict on the client, the tools and the backend contract)
	@$(VENV)/bin/mypy

# The fast tier: the control plane's logic on the in-process backend (tests/inprocess_backend.py),
# and other tests that start no sandbox; no root needed, well under a minute.
FAST_TESTS := tests/fast tests/test_pool_target.py tests/test_store.py tests/test_unix_http.py \
              tests/test_http_session.py tests/test_harbor_formats.py tests/test_error_tree.py \
              tests/test_configuration.py

test-fast: $(VENV)/.stamp  ## the fast tier: service, pool, watcher, forwarding on an in-process backend (no root)
	@$(VENV)/bin/pytest -n 0 -p no:cacheprovider $(FAST_TESTS) $(PYTEST_ARGS)

# The venvs beside the main one: the published client's, and the frameworks' whose pins clash with it;
# the longest installs first (harbor's took 100-180 s, the client's 20-30 s).
SIDE_VENVS := harbor-venv verifiers-venv nemo-gym-venv verl-venv client-venv

test-deps: strace  ## everything the tests need (the venvs are made in parallel)
	@$(MAKE) --no-print-directory -j3 venv $(SIDE_VENVS)
	@$(MAKE) --no-print-directory gym-versions

# strace counts system calls in tests
strace:
	@command -v strace >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -q strace >/dev/null 2>&1 || \
	   (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q strace >/dev/null)); } || \
	  echo "WARNING: no strace: the tests that count a launch's system calls will be skipped"

# Three workers on two cores: the tests wait on image builds' downloads, timeouts and sandboxes'
# starts. With two, a quiet run kept the CPU ~70 % busy and pytest took 16:01; with three, quiet
# fresh-clone runs took 12:53 and 13:16 as the suite was then, and 15:49 with 1,311 tests (CPU 74 %
# busy while pytest ran: 29:04 of user+sys over 18:28, ~5:30 of it the venvs' installs). Four took
# 14:49 and 14:45 (make test 17:30 and 17:22) — three took 14:49 (17:21) too once tests/durations.json
# was regenerated from that run: four gain nothing. (Each run on four failed a test under the load,
# both tests' own faults, since mended: test_fork_control_plane looked at leftovers too soon, and
# test_faults' shared httpx client lost an answer to httpcore's pool: see tests/cp_helpers.py.)
# With the tests' servers forked from a template (tests/forked.py) and the side venvs installed
# beside the suite (below), a fresh-clone run of 7b8f2e2 took pytest 12:48 and make test 14:16
# (1,325 tests; their seconds summed 36.4 min, 43.4 before).
TEST_WORKERS ?= 3
# The tests' modules as pytest runs them (assertions rewritten), compiled ahead by one collection:
# under PYTHONDONTWRITEBYTECODE every worker rewrote them all again (its collection took 9.0-9.2 s
# of CPU, 4.0-4.2 s with these).
test-bytecode: $(VENV)/.stamp
	@out=$$(env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/pytest --collect-only -q -p no:cacheprovider -m "not slow" 2>&1) \
	  || { echo "$$out" | tail -n 40; exit 1; }

# `make test` installs the side venvs in the background, from its start, while it makes the main
# venv and runs the suite: in four fresh clones they ended 60-130 s after the main venv, which
# pytest waited for. A test that needs one waits for its install (tests/side_venvs.py: the directory
# INSTALLS holds each one's log and outcome). The type check, too, runs beside the suite (mypy took
# 80-100 s after the main venv on a busy host); `make test` fails if any of them failed. Fresh
# clones on a busy host (load 10-27), alternated: pytest began at 275 and 283 s on main (91 and
# 112 s after the main venv), at 159 and 162 s with this (35 and 30 s after it). The side venvs
# were all there 156-161 s into pytest; in a whole run (tests/durations.json's order) the tests
# that need one start from ~170 s in (harbor's, there before pytest) and verl's, the last one
# there, from ~650 s: none should wait.
INSTALLS   := .installs
# The test recipe's sub-makes go through SUBMAKE: a line that names $(MAKE) itself runs even
# under `make -n`, which would have run the suite.
SUBMAKE     = $(MAKE)
# Each in its own session (setsid): Ctrl-C, which sh makes background jobs ignore, or a failure
# before the end stops each with one signal to its group.
test:  ## lint, then the test suite (everything but `slow`) on TEST_WORKERS (3) workers, type check beside it
	@$(SUBMAKE) --no-print-directory strace $(UV)
	@rm -rf $(INSTALLS) && mkdir $(INSTALLS) && touch $(INSTALLS)/started; \
	echo "installing $(SIDE_VENVS) in the background (logs: $(INSTALLS)/)"; \
	groups=; stop() { for group in $$groups; do kill -TERM -$$group 2>/dev/null; done; wait; }; \
	trap 'stop; exit 130' INT TERM HUP; \
	setsid sh -c '$(SUBMAKE) --no-print-directory -k -j2 $(SIDE_VENVS:%=$(INSTALLS)/%) >$(INSTALLS)/make.log 2>&1; \
	  echo $$? >$(INSTALLS)/done' & groups=$$!; \
	$(SUBMAKE) --no-print-directory -j3 venv lint test-bytecode $(VENV)/.stamp-typecheck && \
	{ setsid sh -c '$(SUBMAKE) --no-print-directory typecheck >$(INSTALLS)/typecheck.log 2>&1 || touch $(INSTALLS)/typecheck.failed' & \
	  groups="$$groups $$!"; } && \
	$(SUBMAKE) --no-print-directory gym-versions bytecode && \
	IDEGYM_BACKGROUND_INSTALLS=$(CURDIR)/$(INSTALLS) $(VENV)/bin/pytest -m "not slow" -n $(TEST_WORKERS) $(PYTEST_ARGS); \
	status=$$?; \
	if [ $$status != 0 ]; then stop; else wait; cat $(INSTALLS)/typecheck.log; \
	  [ "$$(cat $(INSTALLS)/done)" = 0 ] && [ ! -e $(INSTALLS)/typecheck.failed ] || \
	  { echo "FAILED: the background installs or type check (see $(INSTALLS)/)"; status=1; }; fi; \
	for failed in $(INSTALLS)/*.failed; do [ -e "$$failed" ] || continue; \
	  echo "FAILED in the background: make $$(basename $$failed .failed); its log ($${failed%.failed}.log) ends:"; \
	  tail -n 20 "$${failed%.failed}.log"; done; \
	if [ -s $(INSTALLS)/waits ]; then echo "tests that waited for the background installs:"; cat $(INSTALLS)/waits; fi; \
	exit $$status

# One side venv's install in the background of `make test`: its output in a log of its own, then
# its outcome (tests/side_venvs.py waits for it).
$(INSTALLS)/%:
	@$(MAKE) --no-print-directory $* >$@.log 2>&1 && touch $@.ok || { touch $@.failed; exit 1; }

test-slow: test-deps  ## only the long-running tests
	@$(VENV)/bin/pytest -m slow $(PYTEST_ARGS)

bench: venv client-venv harbor-venv nemo-gym-venv verl-venv verifiers-venv  ## the benchmark suite; writes benchmarks/results/
	@$(PY) -m benchmarks $(BENCH)

clean:  ## remove the virtual environments
	rm -rf $(VENV) $(CLIENT_VENV) $(HARBOR_VENV) $(NEMO_VENV) $(VERL_VENV) $(VERIFIERS_VENV) $(UV_VENV) .gym-versions
