# django-xjobs: the two commands a new machine needs are `make demo` and `make test`.
#
#   make demo                 migrate the example project, enqueue real work, run a worker, show it
#   make test                 the whole suite against a real PostgreSQL (installs chromium and
#                             pgbouncer for the browser and pooler tests where it may)
#   make bench                our own benchmark table (bench/; BENCH_ARGS="--workloads W3,W8")
#   make bench-flow           flow control: W8, W11-W13 (slots, fair share, rate limit, hand-over)
#   make bench-scale          claim latency and drain rate at 10k/100k/1M queued, 1M in history
#   make bench-capacity       how far one database goes: drain rate with 1 and 2 workers, WAL,
#                             commits, rows and connections per job (bench/capacity.py)
#   make bench-sharded        a drain over three shards (three private clusters) beside one
#                             database's, the same worker processes (bench/sharded_drain.py)
#   make bench-replica        the console's reads per refresh on the primary and on a streaming
#                             replica, with and without XJOBS["READ_DATABASE"]
#   make bench-horizon        W15: an offered load while a snapshot is held 30 minutes, beside
#                             the raw reference (BENCH_ARGS="--hold 300" for a shorter one)
#   make bench-peers          the peers' harness and django-xjobs in one run
#                             (PEERS_HARNESS=<its folder>; BASELINE=<git rev> adds that
#                             revision beside this checkout; docs/performance.md)
#   make lint                 ruff + import-linter (the layer contract) + mypy (pyproject.toml)
#   make bench-admin          the console's page render times at 10,000,000 jobs (history in
#                             the day tables, as the archive leaves them)
#   make bench-migrations     each migration's time, lock and enqueue stall at 10,000,000 jobs
#                             under a running producer (docs/deployment.md)
#   make bench-ab BASELINE=REV  this checkout against git revision REV, alternating, one run
#   make screenshots          the console's screenshots in docs/img (the browser test)
#   make upgrade-check        the upgrade test at 1,000,000 rows: each baseline of
#                             tests/upgrade/baselines.py migrated to this checkout under load,
#                             both fleets side by side; prints the report (UPGRADE_ARGS="--rows N")
#   make soak                 the chaos self-test, 5 minutes on the example project's database
#                             (SOAK_ARGS="--duration 10m --seed 42"; docs/soak.md)
#   make release              the sdist and wheel in dist/, checked, and the wheel installed in a
#                             fresh virtualenv running the quickstart; uploads nothing
#                             (docs/development.md, "Cutting a release")
#   make docs                 the documentation site in docs/_build/html (Sphinx: every warning
#                             an error, every reference and anchor checked; docs/development.md,
#                             "The documentation site")
#
# PYTHON picks the interpreter, DJANGO the Django series (e.g. DJANGO=5.2 or DJANGO=6.1; empty =
# the newest this Python supports), VENV the virtualenv (default .venv). The database is
# DATABASE_URL, else a server on 127.0.0.1:5432, else an embedded PostgreSQL (pgserver) under
# .pgdata/; the commands print which one they use.

PYTHON ?= python3
DJANGO ?=
VENV ?= .venv
PY := $(VENV)/bin/python
DJANGO_REQ := $(if $(DJANGO),Django==$(DJANGO).*,)
STAMP := $(VENV)/.installed-django$(if $(DJANGO),$(DJANGO),-latest)
PYTEST_ARGS ?=
# Two pytest processes (pytest-xdist), each on its own test database: tests/conftest.py keeps
# the worker-fleet tests to one of them, one at a time.
TEST_PROCESSES ?= 2
SOAK_ARGS ?= --duration 5m

.PHONY: demo test soak upgrade-check bench bench-flow bench-scale bench-capacity bench-sharded bench-replica bench-horizon bench-peers bench-admin bench-migrations bench-ab lint install clean-db browser pooler faketime screenshots

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]' $(DJANGO_REQ)
	@rm -f $(VENV)/.installed-django*
	@touch $@

install: $(STAMP)
	@# The embedded PostgreSQL is only needed where no server is configured or answering.
	@if [ -z "$$DATABASE_URL" ] && ! $(PY) -c "import socket; socket.create_connection(('127.0.0.1', 5432), 0.5)" 2>/dev/null; then \
		$(PY) -c "import pgserver" 2>/dev/null || $(PY) -m pip install -q -e '.[embedded]'; \
	fi

test: install browser pooler faketime
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadgroup $(PYTEST_ARGS)

# Tools some tests drive, from Debian's packages: $(call apt_ensure,CHECK,PACKAGE,TESTS) runs
# CHECK; when it fails and we may (root, apt-get), installs PACKAGE quietly, waiting for another
# apt's lock rather than failing; elsewhere says which tests will skip (they say why, and CI's
# XJOBS_REQUIRE_* variables make that a failure). A no-op once the tool is there.
define apt_ensure
	@{ $(1); } >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "make: installing Debian's $(2) for $(3)"; \
			( apt-get update -qq -o DPkg::Lock::Timeout=120 && DEBIAN_FRONTEND=noninteractive \
				apt-get install -y -qq -o DPkg::Lock::Timeout=120 $(2) ) >/dev/null 2>&1 \
				|| echo "make: could not install $(2); $(3) will skip"; \
		else \
			echo "make: no $(2) (not root or no apt-get); $(3) will skip"; \
		fi; \
	}
endef

# The console's browser tests (XJOBS_REQUIRE_BROWSER).
browser:
	$(call apt_ensure,command -v chromium,chromium,the console's browser tests)

# The pooler tests, tests/acceptance/test_pooler.py and the soak behind PgBouncer
# (XJOBS_REQUIRE_POOLER).
pooler:
	$(call apt_ensure,test -x /usr/sbin/pgbouncer || command -v pgbouncer,pgbouncer,the pooler tests)

# The worker clock tests, tests/acceptance/test_worker_clock.py: libfaketime shifts a worker's
# wall clock (XJOBS_REQUIRE_FAKETIME).
faketime:
	$(call apt_ensure,ls /usr/lib/*/faketime/libfaketime.so.1 || ls /usr/lib/faketime/libfaketime.so.1,faketime,the worker clock tests)

screenshots: install browser
	XJOBS_SCREENSHOT_DIR=$(CURDIR)/docs/img XJOBS_REQUIRE_BROWSER=1 \
		$(PY) -m pytest -q tests/acceptance/test_console_browser.py

demo: install
	cd example_project && ../$(PY) manage.py demo

soak: install
	cd example_project && ../$(PY) manage.py shell -c "from django.conf import settings; \
		from tests import devdb; devdb.ensure_database(settings.DATABASES['default'])" \
		&& ../$(PY) manage.py migrate -v 0 && ../$(PY) manage.py xjobs_soak $(SOAK_ARGS)

# Needs the repository's history (the baseline comes out of git): not a shallow clone.
upgrade-check: install
	@for baseline in $$($(PY) -c "from tests.upgrade.baselines import BASELINES; print(*BASELINES)"); do \
		echo "== from $$baseline"; \
		$(PY) -m tests.upgrade.run --rows 1000000 --baseline $$baseline $(UPGRADE_ARGS) || exit 1; \
	done

bench: install
	$(PY) bench/run.py $(BENCH_ARGS)

bench-flow: install
	$(PY) bench/run.py --workloads W8,W11,W12,W13 $(BENCH_ARGS)

bench-children: install
	$(PY) bench/run.py --workloads W14 $(BENCH_ARGS)

bench-scale: install
	$(PY) bench/scale.py $(BENCH_ARGS)

# How far one database goes: drain rates with 1 and 2 workers, WAL, commits, rows and
# connections per job (bench/capacity.py; docs/scaling.md, "How far one database goes").
bench-capacity: install
	$(PY) bench/capacity.py $(BENCH_ARGS)

bench-sharded: install
	$(PY) bench/sharded_drain.py $(BENCH_ARGS)

bench-replica: install
	$(PY) bench/replica_reads.py $(BENCH_ARGS)

bench-horizon: install
	$(PY) bench/horizon.py --systems xjobs $(BENCH_ARGS)
	$(PY) bench/horizon.py --systems raw $(BENCH_ARGS)

bench-admin: install
	$(PY) bench/admin_pages.py $(BENCH_ARGS)

bench-migrations: install
	$(PY) bench/migrations.py $(BENCH_ARGS)

# A/B in one run: this checkout against BASELINE (a git revision), same workloads, alternating.
bench-ab: install
	@test -n "$(BASELINE)" || { echo "make bench-ab needs BASELINE=<git revision>"; exit 2; }
	$(PY) bench/ab.py --baseline $(BASELINE) $(BENCH_ARGS)

# The harness runs its workers with PYTHONDONTWRITEBYTECODE=1 and installs this checkout in
# editable mode, so without this step every worker would compile django_xjobs from source at
# start-up; pip compiles bytecode for the peers' (non-editable) installs, so we do it too.
BENCH_PYTHON ?= $(shell PYENV_VERSION=3.12.1 pyenv which python3.12 2>/dev/null || command -v python3.12)

# The peers' harness is not part of this repository: PEERS_HARNESS names a checkout of it (the
# folder holding its run.sh; docs/performance.md, "Beside the peers").
PEERS_HARNESS ?=

# BASELINE=<git rev> adds that revision as one more system, "django-xjobs-baseline" (exported
# into PEERS_BASELINE_DIR by git archive; bench/xjobs_baseline_adapter.py), e.g.
#   make bench-peers PEERS_HARNESS=DIR BASELINE=main PEERS_OUT=/tmp/peers.md \
#     BENCH_ARGS="--systems raw,raw-update,django-xjobs,django-xjobs-baseline --no-variants"
PEERS_OUT ?= bench/RESULTS.md
PEERS_BASELINE_DIR ?= $(or $(TMPDIR),/tmp)/xjobs-bench-baseline
PEERS_ADAPTERS := bench/xjobs_adapter.py$(if $(BASELINE),:bench/xjobs_baseline_adapter.py)

bench-peers: install
	@test -n "$(PEERS_HARNESS)" -a -x "$(PEERS_HARNESS)/run.sh" || { \
		echo "make bench-peers needs PEERS_HARNESS=<folder of the peers' harness, holding run.sh>"; exit 2; }
	$(BENCH_PYTHON) -m compileall -q django_xjobs bench/xbench_project tests/devdb.py tests/__init__.py
	$(if $(BASELINE),rm -rf $(PEERS_BASELINE_DIR) && mkdir -p $(PEERS_BASELINE_DIR) && \
		git archive $(BASELINE) django_xjobs tests bench/xbench_project | tar -x -C $(PEERS_BASELINE_DIR) && \
		cd $(PEERS_BASELINE_DIR) && $(BENCH_PYTHON) -m compileall -q django_xjobs bench/xbench_project \
		tests/devdb.py tests/__init__.py)
	XBENCH_EXTRA_PIP="-e $(CURDIR)" XBENCH_EXTRA_ADAPTERS=$(PEERS_ADAPTERS) \
		XBENCH_XJOBS_BASELINE=$(PEERS_BASELINE_DIR) \
		XBENCH_XJOBS_BASELINE_REV="$(if $(BASELINE),$(shell git rev-parse --short $(BASELINE) 2>/dev/null))" \
		$(PEERS_HARNESS)/run.sh --out $(PEERS_OUT) $(BENCH_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

clean-db:
	rm -rf .pgdata

# A release's sdist and wheel, built by python -m build (the wheel from the sdist, in an
# isolated build environment, as a package index builds it) and checked: twine check, their
# contents and the wheel installed with its dependencies into a fresh virtualenv running the
# quickstart on a scratch database (tests/release_check.py). build and twine come from the
# `release` extra, installed here only.
.PHONY: release
RELEASE_STAMP := $(VENV)/.installed-release

$(RELEASE_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[release]'
	@touch $@

release: install $(RELEASE_STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m twine check --strict dist/*
	$(PY) -m tests.release_check dist $(if $(DJANGO),--django $(DJANGO),)

# The documentation site (docs/conf.py): the pages of docs/ and the API reference from the
# docstrings, into docs/_build/html. -W --keep-going: every warning fails the build, after all
# are listed; -n: every reference, link between pages and #anchor must resolve; -E: read every
# page and docstring again, so a warning of an unchanged page is never skipped. The reference
# of the django.tasks backend imports django.tasks, so the site is built on Django 6.1, which
# needs Python 3.12 or newer: its own virtualenv (DOCS_VENV), from the first python3.13 or
# python3.12 that runs (on PATH or pyenv's) unless DOCS_PYTHON names one. sphinx, myst-parser and
# furo come from the `docs` extra, installed there only.
DOCS_VENV ?= .venv-docs
DOCS_PYTHON ?= $(shell for v in 3.13 3.12; do \
	for p in "$$(command -v python$$v)" \
	         "$$(PYENV_VERSION=$$(pyenv versions --bare 2>/dev/null | grep -m1 "^$$v") pyenv which python$$v 2>/dev/null)"; do \
		[ -n "$$p" ] && "$$p" -c "" 2>/dev/null && { echo "$$p"; exit; }; \
	done; done)
DOCS_STAMP := $(DOCS_VENV)/.installed-docs
.PHONY: docs

$(DOCS_STAMP): pyproject.toml
	@test -n "$(DOCS_PYTHON)" || { echo "make docs needs Python 3.12 or newer (the site is built on Django 6.1): none found; give DOCS_PYTHON=<its path>"; exit 2; }
	$(MAKE) --no-print-directory install PYTHON=$(DOCS_PYTHON) DJANGO=6.1 VENV=$(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q -e '.[docs]' 'Django==6.1.*'
	@touch $@

docs: $(DOCS_STAMP)
	$(DOCS_VENV)/bin/sphinx-build -W --keep-going -n -E -b html docs docs/_build/html
