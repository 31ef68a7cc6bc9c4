# tstage - build, run, test and benchmark.
#
#   make            build build/tstaged (with CUDA wherever nvcc is found)
#   make run        install missing packages, build, run on the embedded default
#   make test       install missing packages, build, run unit + integration tests
#   make bench      benchmark table (ratios against references measured in the same run)
#   make CUDA=0     build without the CUDA backend
#   make SANITIZE=address,undefined test   (or SANITIZE=thread)

# ---- toolchain and CUDA detection -----------------------------------------
CC        ?= cc
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(firstword $(shell command -v nvcc 2>/dev/null) \
                 $(wildcard /usr/local/cuda/bin/nvcc)))
NVCC      ?= $(if $(CUDA_HOME),$(CUDA_HOME)/bin/nvcc)
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(NVCC),1,0)
endif

SANITIZE  ?=
# DEBUG=1: the costlier invariant checks (TS_DEBUG: a published array
# version is sealed and checked unmodified); on in every sanitizer build,
# off in release. A plain DEBUG=1 build has a folder of its own.
DEBUG     ?= $(if $(SANITIZE),1,0)
ifeq ($(DEBUG)$(SANITIZE),1)
BUILD     ?= build/debug
endif
# FAULT=1: the fault-injection build (common/fault.h), in a folder of its own
FAULT     ?= 0
ifeq ($(FAULT),1)
FAULT_DIR := fault
endif
ifeq ($(SANITIZE),)
BUILD     ?= build$(if $(FAULT_DIR),/$(FAULT_DIR))
else
BUILD     ?= build/$(if $(FAULT_DIR),$(FAULT_DIR)-)san-$(subst $(comma),-,$(SANITIZE))
endif
comma := ,

# libcurl: the fleet's poller asks the peers of --peers (server/fleet.c);
# hwloc: the node's NUMA topology and device locality (device/topology.c);
# ucx: the fleet's data path, UCP over --fleet-port (server/fleet_ucx.c)
PKGS      := libmicrohttpd jansson libcurl hwloc ucx
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

# The project's flags live in TS_*; a user's CPPFLAGS, CFLAGS, LDFLAGS and
# LDLIBS (from the environment or the command line) come after them, so
# that `make CFLAGS=-O0` adds -O0 instead of dropping -std=c11, -Werror and
# the dependency files.
OPT       ?= -O2
TS_CPPFLAGS := -I. -D_GNU_SOURCE $(PKG_CFLAGS)
TS_CFLAGS := -std=c11 $(OPT) -g -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter \
             -fno-strict-aliasing -fno-math-errno -pthread -MMD -MP
TS_LDLIBS := $(PKG_LIBS) -lopenblas -lpthread -lm
TS_LDFLAGS := -pthread

ifeq ($(FAULT),1)
TS_CPPFLAGS += -DTS_FAULT_BUILD=1
endif

ifeq ($(DEBUG),1)
TS_CPPFLAGS += -DTS_DEBUG=1
endif

ifneq ($(SANITIZE),)
TS_CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
TS_LDFLAGS += -fsanitize=$(SANITIZE)
endif

# UCX's memory hooks (libucm, installed when the library loads: every
# process that links it) patch madvise, which glibc calls as a thread exits,
# after ThreadSanitizer has let go of that thread: a crash at the first
# thread's exit. Sanitized with thread, the tests run without them (what
# they give UCX, a registration cache that sees memory unmapped, the fleet's
# tests do not need).
ifneq ($(filter thread,$(subst $(comma), ,$(SANITIZE))),)
export UCX_MEM_EVENTS := no
endif

ifeq ($(CUDA),1)
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
TS_CPPFLAGS += -DTS_HAVE_CUDA=1 -isystem $(CUDA_HOME)/include
CUDART_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart
TS_LDLIBS += $(CUDART_LIBS) -lcublas -lnccl -lstdc++
NVCCFLAGS ?= -O2 -std=c++17 $(CUDA_ARCH) -Xcompiler -fPIC,-Wall -I.
endif

# The version and git revision reach one object, common/version.o, which is
# rebuilt whenever either changes ($(BUILD)/version.stamp is rewritten only
# then): --version and tstage_build_info follow HEAD without a clean build.
VERSION   := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
GIT_REV   := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

ALL_CPPFLAGS = $(TS_CPPFLAGS) $(CPPFLAGS)
ALL_CFLAGS   = $(TS_CFLAGS) $(CFLAGS)
ALL_LDFLAGS  = $(TS_LDFLAGS) $(LDFLAGS)
ALL_LDLIBS   = $(TS_LDLIBS) $(LDLIBS)

# ---- sources ---------------------------------------------------------------
# The floors, bottom to top, and the one place they are named: a file may
# include headers from its own folder and from the floors below it, never
# from above (tests/make/floors.sh checks). Folders joined by '|' share a
# floor and do not see each other: the array catalog (storage), the
# operations runner (ops) and training (train) each build on device, memory
# and formats alone; jobs joins them (the work operations run: steps,
# evaluations, model creation, moves, imports), and handlers parse, submit
# a job and render. The library is every .c of these folders (less main()
# and the backend not built).
FLOORS    := common device memory formats storage|ops|train jobs handlers server
LIB_DIRS  := $(subst |, ,$(FLOORS))
LIB_SRC   := $(filter-out server/main.c device/cuda_%.c device/nocuda.c train/cuda_%.c \
                 train/nocuda_%.c, \
               $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c)))
ifeq ($(CUDA),1)
LIB_SRC   += $(wildcard device/cuda_*.c train/cuda_*.c)
CU_SRC    := $(wildcard device/*.cu train/*.cu)
else
LIB_SRC   += device/nocuda.c $(wildcard train/nocuda_*.c)
CU_SRC    :=
endif
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
LIB       := $(BUILD)/libtstage.a
DAEMON    := $(BUILD)/tstaged

UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
# every unit suite links the one main, the backend switch and the sim fixture
UNIT_COMMON := $(BUILD)/obj/tests/unit/unit.o
IT_SRC    := $(wildcard tests/integration/it_*.c)
IT_BIN    := $(IT_SRC:tests/integration/%.c=$(BUILD)/tests/%)
# it_faults needs a fault-injection daemon: `make faults` runs it
IT_FAULTS := $(BUILD)/tests/it_faults
IT_BIN    := $(filter-out $(IT_FAULTS),$(IT_BIN))
# the longest suites first, so that the rest fill the other core beside them
# (tests/run_suites.sh runs TEST_JOBS at a time)
IT_FIRST  := $(addprefix $(BUILD)/tests/,it_optax it_models it_moves it_arrays)
IT_BIN    := $(foreach t,$(IT_FIRST),$(filter $(t),$(IT_BIN))) $(filter-out $(IT_FIRST),$(IT_BIN))
UNIT_FIRST := $(addprefix $(BUILD)/tests/,test_kernels test_exec test_cpu_team)
UNIT_BIN  := $(foreach t,$(UNIT_FIRST),$(filter $(t),$(UNIT_BIN))) $(filter-out $(UNIT_FIRST),$(UNIT_BIN))
IT_COMMON := tests/integration/harness.c tests/common/spawn.c
BENCH_SRC := $(wildcard tests/bench/bench_*.c)
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)
BENCH_COMMON := tests/bench/benchlib.c tests/common/spawn.c
# an integration suite or bench is compiled with its common sources (its
# harness, and tests/common/spawn.c, the child processes both start) in one
# command, whose dependency file keeps only the last source's headers: each
# depends on every header instead
TEST_HEADERS := $(wildcard */*.h tests/*/*.h)

CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
CURL_LIBS  := $(shell pkg-config --libs libcurl 2>/dev/null)

.PHONY: all run test unit integration test-bins pytest bench clean deps fuzz gpu-bundle faults soak
all: $(DAEMON)

deps:
	@scripts/deps.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CPPFLAGS) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/version.stamp: FORCE
	@mkdir -p $(@D)
	@echo '$(VERSION) $(GIT_REV)' | cmp -s - $@ || echo '$(VERSION) $(GIT_REV)' > $@

$(BUILD)/obj/common/version.o: $(BUILD)/version.stamp
$(BUILD)/obj/common/version.o: TS_CPPFLAGS += -DTS_VERSION='"$(VERSION)"' -DTS_GIT_REV='"$(GIT_REV)"'

.PHONY: FORCE
FORCE:

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -DTS_HAVE_CUDA=1 -c $< -o $@

# the documents the daemon serves are assembled into it (.incbin)
$(BUILD)/obj/server/assets.o: openapi.yaml server/dashboard.html

# nvcc writes no dependency files: the CUDA kernels' headers by hand
$(BUILD)/obj/train/cuda_kernels.cu.o: train/kernels_math.h train/kernels_int.h train/kernels.h

# the CPU training kernels are loops the vectoriser should take whole
# (-fno-trapping-math lets it turn their selects into blends; no rounding
# changes)
$(BUILD)/obj/train/kernels_cpu.o: TS_CFLAGS += -O3 -fno-trapping-math

$(LIB): $(LIB_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(DAEMON): $(BUILD)/obj/server/main.o $(LIB)
	$(CC) $(ALL_LDFLAGS) $^ $(ALL_LDLIBS) -o $@

$(BUILD)/tests/test_%: tests/unit/test_%.c $(UNIT_COMMON) $(LIB)
	@mkdir -p $(@D)
	$(CC) $(ALL_CPPFLAGS) $(ALL_CFLAGS) $(ALL_LDFLAGS) $< $(UNIT_COMMON) $(LIB) $(CHECK_LIBS) $(ALL_LDLIBS) -o $@

$(BUILD)/tests/it_%: tests/integration/it_%.c $(IT_COMMON) $(TEST_HEADERS)
	@mkdir -p $(@D)
	$(CC) $(ALL_CPPFLAGS) $(ALL_CFLAGS) $(ALL_LDFLAGS) $< $(IT_COMMON) $(CHECK_LIBS) $(CURL_LIBS) $(PKG_LIBS) -lm $(IT_LIBS) -o $@

# it_lease opens a GPU array's lease as a client does (cudaIpcOpenMemHandle)
$(BUILD)/tests/it_lease: IT_LIBS = $(CUDART_LIBS)

$(BUILD)/bench/soak: tests/bench/soak.c $(BENCH_COMMON) $(LIB) $(TEST_HEADERS)
	@mkdir -p $(@D)
	$(CC) $(ALL_CPPFLAGS) $(ALL_CFLAGS) $(ALL_LDFLAGS) $< $(BENCH_COMMON) $(LIB) $(CURL_LIBS) $(ALL_LDLIBS) -o $@

$(BUILD)/bench/bench_%: tests/bench/bench_%.c $(BENCH_COMMON) $(LIB) $(TEST_HEADERS)
	@mkdir -p $(@D)
	$(CC) $(ALL_CPPFLAGS) $(ALL_CFLAGS) $(ALL_LDFLAGS) $< $(BENCH_COMMON) $(LIB) $(CURL_LIBS) $(ALL_LDLIBS) -o $@

# libFuzzer targets: each parser compiled again with coverage, the rest from the library
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 10
FUZZ_FLAGS   := -g -O1 -fsanitize=fuzzer,address,undefined
FUZZ_router  := server/router.c
FUZZ_query   := server/router.c common/utf8.c
FUZZ_wait    := handlers/wait.c
FUZZ_index   := formats/index.c
FUZZ_units   := common/units.c
FUZZ_base64  := common/base64.c
FUZZ_config  := server/config.c common/units.c device/topology.c memory/space.c
FUZZ_npy     := formats/npy.c formats/dtype.c
FUZZ_safetensors := formats/safetensors.c formats/dtype.c
FUZZ_sharding := handlers/sharding_json.c storage/sharding.c
FUZZ_model_spec := jobs/model_spec.c
FUZZ_rows    := formats/index.c
FUZZ_lease   := server/lease_proto.c
FUZZ_lease_stream := server/lease_proto.c
FUZZ_first_request := server/accept.c
FUZZ_first_head := server/head.c
FUZZ_history_query := server/history.c
FUZZ_BIN     := $(patsubst tests/fuzz/fuzz_%.c,$(BUILD)/fuzz/fuzz_%,$(wildcard tests/fuzz/fuzz_*.c))

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(LIB)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(ALL_CPPFLAGS) -std=c11 $(FUZZ_FLAGS) $< $(FUZZ_$*) $(LIB) $(ALL_LDLIBS) -o $@

fuzz: $(FUZZ_BIN)
	@tests/fuzz/run.sh $(BUILD)/fuzz $(FUZZ_SECONDS)

run: deps
	@$(MAKE) --no-print-directory all
	$(DAEMON) $(ARGS)

# The suites run TEST_JOBS at a time (default: one per CPU), each one's
# output in $(BUILD)/test-logs (tests/run_suites.sh); TEST_JOBS=1 runs them
# one after another.
TEST_JOBS ?= $(shell nproc)

# every suite built, none run (a parallel build before a run of unit and
# integration one after the other)
test-bins: $(UNIT_BIN) $(IT_BIN)

unit: $(UNIT_BIN)
	@JOBS=$(TEST_JOBS) LOGS=$(BUILD)/test-logs CK_DEFAULT_TIMEOUT=120 \
		tests/run_suites.sh $(UNIT_BIN)

integration: $(DAEMON) $(IT_BIN)
	@JOBS=$(TEST_JOBS) LOGS=$(BUILD)/test-logs TSTAGED=$(DAEMON) CK_DEFAULT_TIMEOUT=300 \
		tests/run_suites.sh $(IT_BIN)

# The fault-injection walk: a daemon built with FAULT=1 (build/fault), every
# failure point of each workflow failed in turn.
faults:
	@$(MAKE) --no-print-directory FAULT=1 build/fault/tstaged build/fault/tests/test_fault \
		build/fault/tests/test_exec build/fault/tests/test_replicas build/fault/tests/it_faults
	build/fault/tests/test_fault
	CK_RUN_CASE=sim CK_DEFAULT_TIMEOUT=600 build/fault/tests/test_exec
	CK_RUN_CASE=sim2 CK_DEFAULT_TIMEOUT=600 build/fault/tests/test_replicas
	TSTAGED=build/fault/tstaged CK_DEFAULT_TIMEOUT=600 build/fault/tests/it_faults

# The bounded soak against a production daemon (SOAK_SECONDS, default 60).
SOAK_SECONDS ?= 60
soak: $(DAEMON) $(BUILD)/bench/soak
	TSTAGED=$(DAEMON) SOAK_SECONDS=$(SOAK_SECONDS) $(BUILD)/bench/soak

# The Python client's suite (clients/python/tests) against $(DAEMON): the
# package and its test dependencies (PyPI) in a virtual environment under
# build/, reinstalled when the package's files change; pytest (not python -m,
# which would put the source folder first) tests the installed package.
PYVENV    := build/pyvenv
PY_SRC    := clients/python/pyproject.toml $(wildcard clients/python/tstage/*.py)

$(PYVENV)/installed: $(PY_SRC)
	@test -x $(PYVENV)/bin/python || python3 -m venv $(PYVENV)
	$(PYVENV)/bin/python -m pip install --quiet './clients/python[test]'
	@touch $@

pytest: $(DAEMON) $(PYVENV)/installed
	cd clients/python && TSTAGED=$(abspath $(DAEMON)) $(abspath $(PYVENV))/bin/pytest -q -p no:cacheprovider tests

test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory unit integration pytest
	@tests/examples/run.sh $(DAEMON)
	@tests/gpu/detect.sh $(DAEMON)

bench:
	@TS_DEPS_BENCH=1 scripts/deps.sh
	@$(MAKE) --no-print-directory all $(BENCH_BIN)
	@tests/bench/run.sh $(BUILD)

# A folder to carry to a CUDA machine without a package registry (tests/gpu/run.sh).
# bundle_check.sh: it loads with only its own libraries and the system's libc.
gpu-bundle: all $(UNIT_BIN) $(IT_BIN) $(BENCH_BIN)
	@tests/gpu/bundle.sh $(BUILD) $(BUILD)/gpu-bundle
	@tests/gpu/bundle_check.sh $(BUILD)/gpu-bundle.tar.gz

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj $(BUILD)/tests $(BUILD)/bench -name '*.d' 2>/dev/null)
