# coti — build, test, sanitize.  `make` builds ./coti (CPU); `make CUDA=1` adds the GPU backend.
# Sources are picked up by wildcard: a new src/<dir>/<file>.c needs no Makefile edit.
#   src/tools/*.c   -> the coti binary (main in src/tools/main.c)
#   src/**/*.c      -> build/libcoti.a
#   tests/*.c       -> build/test_coti (Criterion), run by `make test`
# Files named *_avx2.c / *_avx512.c get those ISA flags; everything else is built for baseline
# x86-64 and the fast kernels are chosen at run time from the CPU found.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  += -std=c11 $(OPT) -g -Wall -Wextra -Wshadow -Wno-unused-parameter -D_GNU_SOURCE -pthread -MMD -MP -Isrc
LDLIBS  += -lcjson -lmicrohttpd -lpcre2-8 -lm -pthread
SAN     ?=
ifneq ($(SAN),)
CFLAGS  += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=$(SAN)
endif

AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := $(AVX2_FLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni

LIB_SRC  := $(filter-out src/tools/%,$(wildcard src/*.c src/*/*.c))
TOOL_SRC := $(wildcard src/tools/*.c)
TEST_SRC := $(wildcard tests/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

ifeq ($(CUDA),1)
NVCC      ?= nvcc
CUDA_SRC  := $(wildcard src/cuda/*.cu)
CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# wgmma (the f16 prompt matmul) exists for sm_90a only: that file alone is built for it
$(BUILD)/src/cuda/matmul_f16.o: override CUDA_ARCH = -gencode arch=compute_90a,code=sm_90a
CFLAGS    += -DCOTI_CUDA
LDLIBS    += -L/usr/local/cuda/lib64 -lcudart -lstdc++
endif

.PHONY: all test test-server asan cuda cuda-trace clean setup bench fuzz fuzz-run install FORCE
all: coti

FORCE:

# `coti --version` names the commit: git describe into a header that changes only when the
# commit does (so main.o rebuilds then, and only then); without git (a tarball) it is "unknown".
COTI_GIT := $(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
$(BUILD)/coti_git.h: FORCE
	@mkdir -p $(dir $@)
	@echo '#define COTI_GIT "$(COTI_GIT)"' > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp
$(BUILD)/src/tools/main.o: $(BUILD)/coti_git.h
$(BUILD)/src/tools/main.o: CFLAGS += -include $(BUILD)/coti_git.h

coti: $(BUILD)/coti
	cp $< $@

$(BUILD)/coti: $(TOOL_OBJ) $(BUILD)/libcoti.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libcoti.a: $(LIB_OBJ) $(CUDA_OBJ)
	rm -f $@ && ar rcs $@ $^

# tools/cli.c links into the tests too: test_mkmodel and test_gguf compile their tool's file in
$(BUILD)/test_coti: $(TEST_OBJ) $(BUILD)/src/tools/cli.o $(BUILD)/libcoti.a
	$(CC) $(LDFLAGS) -o $@ $^ -lcriterion $(LDLIBS)

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -c -o $@ $<

$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -c -o $@ $<

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) $(CUDA_DEFS) -Isrc -MMD -MP -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -c -o $@ $<

# The suite: unit tests (Criterion) and the CLI-level checks in tests/cli.sh.
# The fuzz harnesses are type-checked here too (they are built with clang's libFuzzer by
# `make fuzz`), so an API change that breaks one fails the tests, not only CI's fuzz run.
test: $(BUILD)/test_coti coti
	$(CC) $(filter-out -MMD -MP,$(CFLAGS)) -fsyntax-only $(wildcard fuzz/fuzz_*.c)
	$(BUILD)/test_coti -j2
	bash tests/cli.sh ./coti
	$(MAKE) test-server

# The server's HTTP tests: tests/server/*.test.mjs drive `coti serve` on loopback with the
# official openai npm client (package-lock.json pins it). COTI_BIN=build-asan/coti runs them
# against the sanitizer build. The load test (node tests/server/load.mjs) is not part of it.
test-server: coti
	[ -d node_modules ] || npm ci --no-audit --no-fund
	node --test tests/server/

# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer, in its own build folder.
# The server tests see a sanitizer report as a non-zero exit of the server (helpers.mjs stop()).
# allocator_may_return_null: a load asking for more memory than exists must see NULL and refuse.
# The unit tests write their model files with ./coti (mkmodel), hence the plain build first.
asan: coti
	$(MAKE) BUILD=build-asan OPT=-O1 SAN=address,undefined build-asan/test_coti build-asan/coti
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 LSAN_OPTIONS=suppressions=tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 build-asan/test_coti -j2
	ASAN_OPTIONS=detect_leaks=1 bash tests/cli.sh build-asan/coti
	[ -d node_modules ] || npm ci --no-audit --no-fund
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 \
	    COTI_BIN=build-asan/coti node --test tests/server/

# The CUDA build in its own folder, leaving ./coti alone: build-cuda/coti and the GPU op test
# program build-cuda/test_cuda_ops (run on a GPU machine; docs/bench-gpu.md). CI builds it to
# prove the GPU code compiles where nvcc exists.
NVCC_FOUND := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
cuda:
	$(MAKE) CUDA=1 BUILD=build-cuda NVCC=$(NVCC_FOUND) build-cuda/coti build-cuda/test_cuda_ops

# The same with every kernel's blocks noting their start, release and end (src/cuda/trace.cuh):
# COTI_TRACE=file build-cuda-trace/coti ..., then scripts/cuda_timeline.py file.
cuda-trace:
	$(MAKE) CUDA=1 BUILD=build-cuda-trace NVCC=$(NVCC_FOUND) CUDA_DEFS=-DCOTI_CUDA_TRACE build-cuda-trace/coti

$(BUILD)/test_cuda_ops: tests/cuda/test_cuda_ops.c $(BUILD)/libcoti.a
	$(CC) $(CFLAGS) -I/usr/local/cuda/include -o $@ $^ $(LDLIBS)

# libFuzzer targets fuzz/fuzz_<name>.c -> build-fuzz/fuzz_<name>, with the library built by clang
# with coverage, AddressSanitizer and UBSan; seeds in fuzz/corpus/<name>/ (each target says what it covers).
# `make fuzz-run FUZZ_SECONDS=60` runs each for that long, new inputs going to a scratch folder.
FUZZ_SRC     := $(wildcard fuzz/fuzz_*.c)
FUZZ_BIN     := $(FUZZ_SRC:fuzz/%.c=build-fuzz/%)
FUZZ_SECONDS ?= 60
fuzz:
	$(MAKE) CC=clang BUILD=build-fuzz OPT=-O1 SAN=address,undefined,fuzzer-no-link $(FUZZ_BIN)

$(BUILD)/fuzz_%: fuzz/fuzz_%.c $(BUILD)/libcoti.a
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $(filter %.c %.a,$^) $(LDLIBS)

fuzz-run: fuzz
	set -e; for f in $(FUZZ_BIN); do \
	    t=$$(basename $$f); t=$${t#fuzz_}; scratch=$$(mktemp -d); \
	    $$f -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 -print_final_stats=1 $$scratch fuzz/corpus/$$t \
	        2>build-fuzz/$$t.log || { tail -60 build-fuzz/$$t.log; rm -rf $$scratch; exit 1; }; \
	    grep -E '^stat::number_of_executed_units|^Done' build-fuzz/$$t.log | sed "s/^/$$t: /"; rm -rf $$scratch; \
	done

# Debian packages the build and the tests need (run as root on a fresh machine).
# The openai npm package (the server tests' client) needs Node >= 20 and Debian 12's nodejs is
# 18: then Node 20 comes from the npm registry, whose `node` package ships the binary, into
# /usr/local/bin (ahead of /usr/bin on root's PATH).
setup:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential libcriterion-dev \
	    libcjson-dev libmicrohttpd-dev libpcre2-dev clang
	command -v node >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
	node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' || \
	    npm install -g --no-audit --no-fund node@20
	node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' || \
	    { echo "make setup: node is $$(node --version), the server tests need >= 20 (is /usr/local/bin first on PATH?)"; exit 1; }

# `make install PREFIX=DIR`: the binary to DIR/bin and the shipped models to
# DIR/share/coti/models, where an installed coti looks for its default model.
PREFIX ?= /usr/local
install: coti
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/coti/models
	install -m 755 coti $(DESTDIR)$(PREFIX)/bin/coti
	install -m 644 models/*.gguf models/*.md $(DESTDIR)$(PREFIX)/share/coti/models/

clean:
	rm -rf build build-asan build-cuda build-cuda-trace coti

-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(CUDA_OBJ:.o=.d) $(FUZZ_SRC:fuzz/%.c=$(BUILD)/%.d)
