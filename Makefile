# Thin wrapper over CMake (the targets there are the source of truth).
#   make deps   install what miniCP needs (Debian 12; idempotent)
#   make peer-deps  the peer study's PyTorch (python3-torch 1.13.1 from Debian; opt-in, not in deps)
#   make        configure + build into build/, executables in build/bin/
#   make test   build, then run ctest (output shown on failure)
#   make run    the main job: minicp on inputs/default.toml, 2 ranks (RANKS=n, DECK=file; about 6 minutes)
#   make study  the full default study: inputs/study.toml, 2 ranks, into results/study.h5 (12-28 minutes with the host)
#   make kernel-study  the kernel study (attention vs the same run's SGEMM)
#   make bench  the full kernel benchmark suite, JSON into results/
#   make cp-study  overlap, CP efficiency and imbalance of the CP schemes (2 ranks)
#   make fidelity-study  fp32 and bf16 error of every scheme against fp64 at P = 1..8, into results/fidelity.json
#                        (ranks oversubscribe the cores; minutes; `make plots RUN=results/fidelity.json` draws it)
#   make documents-study  packed documents: area imbalance, traffic and step time per dispatch and scheme, per
#                         mix (2 ranks timed, 4 and 8 counted, 64 predicted; about 10 minutes), results/documents/
#   make fabric-study  one sweep under every local and emulated fabric profile, alpha/beta of each
#                      (emulated nodes: slurm/vcluster, as root; about 105 minutes), into results/fabric/
#   make mesh-study  TP2 x CP2 on 2 emulated nodes (vc-1g), TP inside a node against TP across the link (as root;
#                    minutes), into results/mesh/
#   make peer-study  the cpu-small layer in miniCP (`none`, 1 rank x PEER_THREADS threads) and in PyTorch,
#                    bf16 and fp32 alternated, PEER_ROUNDS rounds at S = PEER_S (needs make peer-deps;
#                    about 5 minutes), into results/peer.json (PEER_ARGS: more of peer_study.py's flags)
#   make scaling-study  slurm/submit over 1 and 2 emulated nodes (strong and weak), one study index
#   make calibrate  the performance model's table (results/calibration.txt) for DECK, RANKS ranks
#   make predict-check  the model's predictions against results/default.h5, results/study.h5 and the fabric study's
#                     files (those present)
#                     (each with the table its run measured; not the 2x2 layouts: 4 ranks on 2 cores)
#   make test-long  the tests labelled `long` (kept out of make test's 10-minute budget)
#   make report RUN=file.h5  the summary table of a run (RUN: one or more .h5, or a study index .csv)
#   make plots RUN=file.h5 [OUT=dir]  PNG plots of a run into OUT (default results/plots/<stem of RUN>/)
#   make docs   docs/generated/: the tables of schemes, deck keys and figures, from minicp's
#               --list-* --json (tools/gen-docs; a file already right is left untouched)
#   make format  clang-format the tracked *.cpp/*.hpp in place (style: .clang-format; make test checks it)
#   make sanitize  ASan + UBSan build in build-sanitize/, then ctest there (any report fails)
#   make clean  removes build/ and build-sanitize/
#   make help   this list, then the variables with their values
BUILD ?= build
SANITIZE_BUILD ?= build-sanitize
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)
PY ?= /usr/bin/python3
CLANG_FORMAT ?= clang-format
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

RANKS ?= 2
DECK ?= inputs/default.toml
MPIRUN ?= mpirun
# One thread per rank (the ranks share the cores), ranks not bound so that Open MPI's
# oversubscription rule does not refuse more ranks than cores.
MPIRUN_FLAGS ?= --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x OMP_PROC_BIND=false

# A variable that holds one value (a file, a directory, a program, a number) reaches the
# shell through $(call q,...), single-quoted, so a value like 'a;touch X' stays one argument
# and runs nothing; RUN (one or more files) through $(call qs,...), each word quoted. Those
# that deliberately hold several flags (CMAKE_FLAGS, MPIRUN_FLAGS, RUN_ARGS and the other
# *_ARGS) are left unquoted so that they split into their flags. $(call dq,...) escapes a
# value for inside double quotes (make help prints them).
q = '$(subst ','\'',$(1))'
qs = $(foreach f,$(1),$(call q,$(f)))
dq = $(subst `,\`,$(subst $$,\$$,$(subst ",\",$(subst \,\\,$(1)))))

.PHONY: all help deps configure build test test-long run study calibrate predict-check kernel-study bench cp-study fidelity-study fabric-study mesh-study documents-study scaling-study peer-deps peer-study report plots docs format sanitize clean

all: build

# The comment block at the top of this file, then each variable a command line may set.
help:
	@sed -n '2,/^[^#]/s/^# \{0,1\}//p' $(call q,$(firstword $(MAKEFILE_LIST)))
	@echo
	@echo "Variables (make VAR=value; current value in brackets):"
	@printf '  %-24s %s\n' \
	  "BUILD" "the build directory [$(call dq,$(BUILD))]" \
	  "SANITIZE_BUILD" "make sanitize's build directory [$(call dq,$(SANITIZE_BUILD))]" \
	  "CMAKE_FLAGS" "extra flags of the first configure, e.g. -DMINICP_ENABLE_CUDA=ON [$(call dq,$(CMAKE_FLAGS))]" \
	  "JOBS" "parallel build jobs; make test runs 2 x JOBS quick tests at a time [$(call dq,$(JOBS))]" \
	  "PY" "the Python with h5py, numpy, pandas, matplotlib [$(call dq,$(PY))]" \
	  "CLANG_FORMAT" "make format's clang-format [$(call dq,$(CLANG_FORMAT))]" \
	  "RANKS" "ranks of make run and make calibrate [$(call dq,$(RANKS))]" \
	  "DECK" "the deck of make run and make calibrate [$(call dq,$(DECK))]" \
	  "MPIRUN" "the MPI launcher [$(call dq,$(MPIRUN))]" \
	  "MPIRUN_FLAGS" "its flags [$(call dq,$(MPIRUN_FLAGS))]" \
	  "RUN" "make report / make plots: the results file(s) or study index (required)" \
	  "OUT" "make plots: the output directory [results/plots/<stem of RUN>/]" \
	  "RUN_ARGS" "make run, make study: more flags of minicp (e.g. --out results/mine.h5)" \
	  "STUDY_ARGS" "make kernel-study: more flags of kernel_study.py" \
	  "CP_ARGS" "make cp-study: more flags of cp_study.py" \
	  "FIDELITY_ARGS" "make fidelity-study: more flags of minicp-fidelity" \
	  "FABRIC_ARGS" "make fabric-study: more flags of fabric_study.py" \
	  "MESH_ARGS" "make mesh-study: more flags of mesh_study.py" \
	  "DOCUMENTS_ARGS" "make documents-study: more flags of documents_study.py" \
	  "SCALING_ARGS" "make scaling-study: more flags of slurm/scaling-study" \
	  "PREDICT_ARGS" "make predict-check: more flags of predict_check.py" \
	  "REPORT_ARGS, PLOTS_ARGS" "more flags of the analysis' report and plots commands" \
	  "PEER_S" "make peer-study: tokens [$(call dq,$(PEER_S))]" \
	  "PEER_ROUNDS" "make peer-study: alternated rounds [$(call dq,$(PEER_ROUNDS))]" \
	  "PEER_THREADS" "make peer-study: threads [$(call dq,$(PEER_THREADS))]" \
	  "PEER_ARGS" "make peer-study: more flags of peer_study.py" \
	  "SAN_ASAN_OPTIONS" "make sanitize's ASAN_OPTIONS [$(call dq,$(SAN_ASAN_OPTIONS))]" \
	  "SAN_UBSAN_OPTIONS" "make sanitize's UBSAN_OPTIONS [$(call dq,$(SAN_UBSAN_OPTIONS))]"

deps:
	@./tools/deps.sh

peer-deps:
	@./tools/deps.sh --peer

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(call q,$(BUILD)) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(call q,$(BUILD)) -j $(call q,$(JOBS))

# Tests labelled badinput only parse and refuse (an MPI start-up each, mostly waiting) and
# those labelled quick time nothing (dry runs, the analysis checks): they run 2 x $(JOBS) at
# a time, the others one at a time (their timings and oversubscription checks assume the
# machine to themselves); `long` ones are left to test-long.
# Open MPI makes its session directory (/tmp/ompi.<host>.<uid>) at a job's start and removes
# it when the last job ends; two mpiruns that start together while it is absent race to make
# it, and one fails ("mkdir ... File exists", orte_init failed). A job that sleeps through
# the parallel stage keeps the directory in place.
test: build
	cd $(call q,$(BUILD)) && rc=0; \
	  $(call q,$(MPIRUN)) -np 1 sleep 900 & keeper=$$!; \
	  for i in $$(seq 50); do ls -d /tmp/ompi.*.$$(id -u)/pid.* >/dev/null 2>&1 && break; sleep 0.1; done; \
	  ctest --output-on-failure --timeout 600 -L 'badinput|quick' -j $$(expr 2 \* $(call q,$(JOBS))) || rc=1; \
	  kill $$keeper 2>/dev/null; wait $$keeper 2>/dev/null; \
	  ctest --output-on-failure --timeout 600 -LE 'long|badinput|quick' || rc=1; \
	  exit $$rc

test-long: build
	cd $(call q,$(BUILD)) && ctest --output-on-failure --timeout 1800 -L long

run: build
	mkdir -p results
	$(call q,$(MPIRUN)) -np $(call q,$(RANKS)) $(MPIRUN_FLAGS) $(call q,$(BUILD))/bin/minicp --deck $(call q,$(DECK)) $(RUN_ARGS)

study: build
	mkdir -p results
	$(call q,$(MPIRUN)) -np 2 $(MPIRUN_FLAGS) $(call q,$(BUILD))/bin/minicp --deck inputs/study.toml $(RUN_ARGS)

kernel-study: build
	$(call q,$(PY)) studies/kernel_study.py --bench $(call q,$(BUILD))/bin/minicp-kernels-bench --out results/kernel_study.json $(STUDY_ARGS)

bench: build
	mkdir -p results
	OMP_PROC_BIND=false $(call q,$(BUILD))/bin/minicp-kernels-bench --benchmark_out=results/kernels_bench.json \
	  --benchmark_out_format=json

cp-study: build
	$(call q,$(PY)) studies/cp_study.py --bench $(call q,$(BUILD))/bin/minicp-cp-bench --out results/cp_study.json $(CP_ARGS)

fidelity-study: build
	$(call q,$(PY)) studies/fidelity_study.py --fidelity $(call q,$(BUILD))/bin/minicp-fidelity --mpiexec $(call q,$(MPIRUN)) \
	  --out results/fidelity.json $(FIDELITY_ARGS)

PEER_S ?= 4096
PEER_ROUNDS ?= 3
PEER_THREADS ?= 2
peer-study: build
	$(call q,$(PY)) studies/peer_study.py --minicp $(call q,$(BUILD))/bin/minicp --seq-len $(call q,$(PEER_S)) \
	  --rounds $(call q,$(PEER_ROUNDS)) --threads $(call q,$(PEER_THREADS)) --out results/peer.json $(PEER_ARGS)

documents-study: build
	$(call q,$(PY)) studies/documents_study.py --minicp $(call q,$(BUILD))/bin/minicp --mpiexec $(call q,$(MPIRUN)) \
	  --mpiexec-flags $(call q,$(MPIRUN_FLAGS)) --out results/documents/documents.json $(DOCUMENTS_ARGS)

scaling-study: build
	$(call q,$(PY)) slurm/scaling-study $(SCALING_ARGS)

calibrate: build
	mkdir -p results
	$(call q,$(MPIRUN)) -np $(call q,$(RANKS)) $(MPIRUN_FLAGS) $(call q,$(BUILD))/bin/minicp --deck $(call q,$(DECK)) --calibrate --calibration results/calibration.txt

# Those of the two studies that are there.
PREDICT_FILES = $(wildcard results/default.h5 results/study.h5) $(filter-out %_2x2.h5,$(wildcard results/fabric/*.h5))
predict-check: build
	@test -n $(call q,$(strip $(PREDICT_FILES))) || { echo "make predict-check: no results yet: make run writes results/default.h5, make study results/study.h5, make fabric-study results/fabric/" >&2; exit 2; }
	$(call q,$(PY)) studies/predict_check.py --minicp $(call q,$(BUILD))/bin/minicp $(call qs,$(PREDICT_FILES)) $(PREDICT_ARGS)

fabric-study: build
	$(call q,$(PY)) studies/fabric_study.py --build $(call q,$(BUILD)) $(FABRIC_ARGS)

mesh-study: build
	$(call q,$(PY)) studies/mesh_study.py --build $(call q,$(BUILD)) $(MESH_ARGS)

# The results analysis (analysis/README.md): Python only, nothing to build.
ANALYSIS = PYTHONPATH=analysis $(call q,$(PY)) -m minicp_analysis
report:
	@test -n $(call q,$(strip $(RUN))) || { echo "make report: RUN=FILE.h5 is required (several files, or a study index .csv)" >&2; exit 2; }
	$(ANALYSIS) report $(call qs,$(RUN)) $(REPORT_ARGS)

plots:
	@test -n $(call q,$(strip $(RUN))) || { echo "make plots: RUN=FILE.h5 is required (several files, or a study index .csv)" >&2; exit 2; }
	$(ANALYSIS) plots $(call qs,$(RUN)) $(if $(OUT),--out $(call q,$(OUT))) $(PLOTS_ARGS)

# The docs' generated tables, from the program that was just built (self_description fails
# while they differ from what it prints).
docs: build
	$(call q,$(PY)) tools/gen-docs --minicp $(call q,$(BUILD))/bin/minicp --out docs/generated

# Formats the tracked C++ sources in place (the ctest format.check fails on any it would
# change). miniapp/cp/registry.cpp keeps its table one entry a line between clang-format
# off/on: tests/CMakeLists.txt reads it line by line ("  <name>_scheme(),").
format:
	@command -v $(call q,$(CLANG_FORMAT)) > /dev/null || { echo "format: $(call dq,$(CLANG_FORMAT)) not found (make deps installs it)"; exit 1; }
	git ls-files '*.cpp' '*.hpp' | xargs -r $(call q,$(CLANG_FORMAT)) -i

# Sanitizer run. Any ASan or UBSan report ends the rank with a non-zero exit, so the test
# fails (mpiexec hands its environment to the ranks it starts on this node). Tests that
# judge by output instead of exit code (PASS_REGULAR_EXPRESSION, expected exit codes) are
# covered by the grep of ctest's full log afterwards.
# detect_leaks=0: Open MPI (libmpi, open-pal, open-rte, libevent) keeps allocations past
# MPI_Finalize (about 120 KB in 3300 blocks for a program that only calls MPI_Init and
# MPI_Finalize), which LeakSanitizer would report in every test; memory errors are still caught.
SAN_ASAN_OPTIONS ?= halt_on_error=1:detect_leaks=0:abort_on_error=0
SAN_UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
sanitize: deps
	cmake -S . -B $(call q,$(SANITIZE_BUILD)) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMINICP_SANITIZE=ON $(CMAKE_FLAGS)
	cmake --build $(call q,$(SANITIZE_BUILD)) -j $(call q,$(JOBS))
	cd $(call q,$(SANITIZE_BUILD)) && ASAN_OPTIONS=$(call q,$(SAN_ASAN_OPTIONS)) UBSAN_OPTIONS=$(call q,$(SAN_UBSAN_OPTIONS)) \
	  ctest --output-on-failure --timeout 600
	@if grep -n -E 'runtime error:|ERROR: (Address|Leak)Sanitizer' $(call q,$(SANITIZE_BUILD))/Testing/Temporary/LastTest.log; then \
	  echo "sanitize: a sanitizer report in a test ctest counted as passed (see above)"; exit 1; fi
	@echo "sanitize: all tests passed, no sanitizer report"

clean:
	rm -rf -- $(call q,$(BUILD)) $(call q,$(SANITIZE_BUILD))
