# Faces over harness/: every target sets itself up (project venv; oracle venvs, artifacts and
# goldens are built on first use by the harness itself, into .cache/).
# The first Python >= 3.11 of python3.12, python3.11, python3 (numpy 2.4.6 and mlx 0.32.4 need
# 3.11); PYTHON=... overrides, and is checked all the same.
PYTHON ?= $(shell for p in python3.12 python3.11 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; break; }; done)
VENV := .venv
PY := $(VENV)/bin/python
MODEL ?= smollm2-135m
# pytest-xdist workers for `make test` (2 cores here).
WORKERS ?= auto
# DEVICE=cpu|gpu: the MLX device every side computes on (MLX_PARITY_DEVICE, checked by the harness;
# a hosted macOS runner's paravirtual GPU is refused, its CPU is not: docs/ci.md). Unset: MLX's default.
ifneq ($(DEVICE),)
export MLX_PARITY_DEVICE := $(DEVICE)
endif
# $(call q,TEXT): TEXT as one single-quoted shell word. A user-supplied variable (MODEL, the
# model lists, WORKERS, PYTHON) is data, never shell code: `make parity MODEL='a b; touch X'`
# asks for the model "a b; touch X" (unknown: exit 2) and runs nothing else. ARGS alone is
# split into words, on purpose (several harness options).
q = '$(subst ','\'',$(1))'

.PHONY: help parity goldens test test-nightly nightly signoff lint bench list venv clean-cache mutants vad calibrate quality certify coverage coverage-nightly fuzz mutate

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	@$(call q,$(or $(PYTHON),python3)) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "mlx-parity needs Python >= 3.11, found: $$($(call q,$(or $(PYTHON),python3)) --version 2>&1 | head -n 1 || echo none) ("$(call q,$(or $(PYTHON),python3))"); install python3.11 or newer (Debian/Ubuntu: apt-get install python3.11 python3.11-venv; macOS: brew install python@3.12), or run make PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(call q,$(PYTHON)) -m venv $(VENV)
	$(VENV)/bin/pip install --no-input -q -r requirements.txt
	touch $@

## make parity [MODEL=name] [SCENARIO=id [CHECK=name]] [K=expr] [RERUN_FLAKY=n] [DEVICE=cpu|gpu] [ARGS=...]: gate one model against its oracle (default: the embedded model) on MLX's default device or DEVICE's; SCENARIO/CHECK pick one scenario/check, K is pytest's -k (make itself owns -k), ARGS go to pytest (--lf, -x, node ids)
parity: venv
	$(PY) -m harness parity --model $(call q,$(MODEL)) $(if $(SCENARIO),--scenario $(call q,$(SCENARIO))) $(if $(CHECK),--check $(call q,$(CHECK))) $(if $(K),-k $(call q,$(K))) $(if $(RERUN_FLAKY),--rerun-flaky $(call q,$(RERUN_FLAKY))) $(ARGS)

## make help: every target and its variables
help:
	@sed -n 's/^## //p' Makefile

## make goldens MODEL=name: regenerate a model's goldens explicitly (stale ones included)
goldens: venv
	$(PY) -m harness goldens --model $(call q,$(MODEL))

## make test: the harness's own tests, including the real end-to-end parity of smollm2-135m (within 30 min on 2 cores: tests marked nightly are left to make test-nightly)
test: venv
	$(PY) -m pytest tests -m "not nightly" -n $(call q,$(WORKERS)) --dist loadgroup -p no:cacheprovider $(ARGS)

## make test-nightly: the tests too slow for make test's budget (marked nightly; the nightly CI runs them)
test-nightly: venv
	$(PY) -m pytest tests -m nightly -n $(call q,$(WORKERS)) --dist loadgroup -p no:cacheprovider $(ARGS)

## make nightly: every profile `python -m harness list --nightly` names (a CPU scenario, not `nightly: false`), full-size twins included (minicpm5-2b: ~1.5 GB twin, scoped on CPU; whisper-large-v3-turbo: ~3 GB fp32 twin)
NIGHTLY_MODELS ?= $(shell $(PY) -m harness list --nightly)
nightly: venv
	$(PY) -m harness parity $(foreach m,$(NIGHTLY_MODELS),--model $(call q,$(m))) $(ARGS)

## make signoff [SIGNOFF_MODELS="a b"]: every profile (default) gated and judged with waivers.yaml into
## reports/signoff-<version>-<device>/ (index.html, summary.md, report.json, junit.xml); exit 1 when BLOCKED, 3 when INCOMPLETE (a selection left checks unrun)
SIGNOFF_MODELS ?=
signoff: venv
	$(PY) -m harness signoff $(foreach m,$(SIGNOFF_MODELS),--model $(call q,$(m))) $(ARGS)

lint: venv
	$(PY) -m ruff check harness models tests oracles plugins examples conftest.py
	$(PY) -m ruff format --check harness models tests oracles plugins examples conftest.py
	$(VENV)/bin/actionlint .github/workflows/*.yml

## make quality MODEL=name: quantization quality of the profile's pairs against their controls (docs/quality.md): table, reports/quality-<model>-<device>/; not part of the parity verdict
quality: venv
	$(PY) -m harness quality --model $(call q,$(MODEL)) $(ARGS)

## make bench: harness overhead and in-tree vs mlx-lm decode speed (docs/benchmarks.md)
bench: venv
	$(PY) -m harness bench --model $(call q,$(MODEL))

list: venv
	$(PY) -m harness list

clean-cache:
	rm -rf .cache

## make coverage [COVERAGE_DIR=...]: make test with branch coverage recorded (models/ by the gates' parity runs, the judges by the tests; docs/coverage.md), then its report: every branch not walked, HTML and coverage.json under reports/coverage-<time>/; exit status make test's
COVERAGE_DIR ?= .cache/coverage
coverage: venv
	@rm -rf $(call q,$(COVERAGE_DIR))/parity $(call q,$(COVERAGE_DIR))/tests
	@out=reports/coverage-$$(date -u +%Y%m%dT%H%M%SZ); status=0; \
	MLX_PARITY_COVERAGE=$(call q,$(abspath $(COVERAGE_DIR))) $(PY) -m pytest tests -m "not nightly" -n $(call q,$(WORKERS)) --dist loadgroup -p no:cacheprovider $(ARGS) || status=$$?; \
	$(PY) -m harness coverage --data $(call q,$(abspath $(COVERAGE_DIR))) --html "$$out" --json "$$out/coverage.json" || true; \
	exit $$status

## make coverage-nightly [NIGHTLY_COVERAGE_DIR=...]: make nightly (every profile, every CPU scenario) with the gates' branch coverage of models/ recorded, then its report under reports/coverage-nightly-<time>/ (the nightly figure of docs/coverage.md); exit status make nightly's
NIGHTLY_COVERAGE_DIR ?= .cache/coverage-nightly
coverage-nightly: venv
	@rm -rf $(call q,$(NIGHTLY_COVERAGE_DIR))/parity
	@out=reports/coverage-nightly-$$(date -u +%Y%m%dT%H%M%SZ); status=0; \
	MLX_PARITY_COVERAGE=$(call q,$(abspath $(NIGHTLY_COVERAGE_DIR))) $(MAKE) --no-print-directory nightly || status=$$?; \
	$(PY) -m harness coverage --data $(call q,$(abspath $(NIGHTLY_COVERAGE_DIR))) --area parity --html "$$out" --json "$$out/coverage.json" || true; \
	exit $$status

## make fuzz [FUZZ_MODEL=minicpm5-2b-mini] [FUZZ_EXAMPLES=300]: differential fuzzing against the oracle (docs/fuzz.md): Hypothesis draws chat scenarios, or with a Whisper profile (FUZZ_MODEL=whisper-tiny-en) edited fixture clips and decode options; both sides run them, the gates judge them; each failure shrunk into reports/fuzz-<model>-<time>/found-*.yaml (a Whisper one with its WAV); exit 1 on a finding
FUZZ_MODEL ?= minicpm5-2b-mini
FUZZ_EXAMPLES ?= 300
fuzz: venv
	MLX_PARITY_LOCALIZE=0 $(PY) -m harness fuzz --model $(call q,$(FUZZ_MODEL)) --examples $(call q,$(FUZZ_EXAMPLES)) $(ARGS)

## make mutants: inject known faults into the in-tree implementations; every one must be caught (exit 1 otherwise)
mutants: venv
	MLX_PARITY_LOCALIZE=0 $(PY) -m harness mutants $(ARGS)

## make mutate [MUTATE_MODULES="models/x.py ..."]: automated mutation testing with cosmic-ray (mutation.yaml, docs/mutants.md): every mutant of each target module judged by its narrowest runs; survivors listed per module, reports/mutate-<time>/mutate.json; exit 1 on an untriaged survivor; resumable
MUTATE_MODULES ?=
mutate: venv
	$(PY) -m harness mutate $(foreach m,$(MUTATE_MODULES),--module $(call q,$(m))) $(ARGS)

## make vad: Silero VAD (MLX port) against the silero-vad package on the fixtures (docs/vad.md)
vad: venv
	$(PY) -m harness vad $(ARGS)

## make calibrate MODEL=whisper-tiny-en: the oracle against itself under benign changes -> the L2 token budget (ARGS=--write records it)
## make certify: the artifact's conversion against its original runtime (docs/certificate.md; ARGS="--calibrate --write" records the bound)
certify: venv
	$(PY) -m harness certify --model $(call q,$(MODEL)) $(ARGS)

calibrate: venv
	$(PY) -m harness calibrate --model $(call q,$(MODEL)) $(ARGS)
