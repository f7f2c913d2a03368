# qwen.cu — build and test.
#
#   make                   ./qwen for the oldest GPU the nvcc in use can target (sm_70 = V100 when
#                          it can), and the trained models' quantized files (make trained)
#   make ARCH=sm_90        any other architecture
#   make NVCC=/usr/bin/nvcc ARCH=sm_70     the V100 build with Debian's CUDA 11.8 (see README)
#   make test              build and run the tests (GPU checks are skipped without a GPU)
#   make sanitize          the tests under AddressSanitizer and UBSan; make fuzz: mutated fixtures
#   make bench             test/bench, the measurement tables (GPU only)
#
# Every build embeds PTX next to the machine code, so the binary also runs on newer GPUs: the
# driver compiles the PTX when the program starts.

NVCC ?= nvcc
# major version of the nvcc in use, e.g. 13 or 11
CUDA_MAJOR := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
ifeq ($(CUDA_MAJOR),)
$(error cannot run '$(NVCC) --version': install the CUDA toolkit or set NVCC=/path/to/nvcc)
endif

# Default architecture: sm_70 (V100) when this nvcc can build it; CUDA 13 dropped Volta, so there
# the oldest architecture it supports (sm_75) is used instead, and the build says so.
ifeq ($(origin ARCH),undefined)
  ifeq ($(shell test $(CUDA_MAJOR) -ge 13 && echo yes),yes)
    ARCH := sm_75
    $(info note: CUDA $(CUDA_MAJOR) cannot build for sm_70 (V100); building for sm_75, the oldest it supports. For a V100 build use CUDA 11.8-12.x: make NVCC=/usr/bin/nvcc)
  else
    ARCH := sm_70
  endif
endif
SM := $(subst sm_,,$(ARCH))

# CUDA 11.x supports host compilers only up to gcc 11: use clang-14 there when it is installed
# (Debian's nvidia-cuda-toolkit pairs with it).
HOSTCC ?= $(if $(filter 11,$(CUDA_MAJOR)),$(shell command -v clang-14 2>/dev/null),)
CCBIN := $(if $(HOSTCC),-ccbin $(HOSTCC),)

# nvcc finds ptxas and friends on PATH: put the chosen nvcc's own directory first, so a CUDA 11.8
# nvcc does not pick up CUDA 13's ptxas.
NVCC_RUN = PATH=$(dir $(shell command -v $(NVCC))):$$PATH $(NVCC)

# -O3: optimise host and device code        -lineinfo: source lines in profiles (ncu, sanitizer)
# -gencode ...code=[sm_XX,compute_XX]: machine code for ARCH plus PTX for every later GPU
# -cudart static: the binary needs no CUDA runtime library where it runs
NVFLAGS ?= -O3 -lineinfo -std=c++17
NVFLAGS += -gencode arch=compute_$(SM),code=[sm_$(SM),compute_$(SM)] -cudart static $(CCBIN)
# host warnings; gcc also warns about snprintf truncating, which is what we ask of it
comma := ,
HOSTWARN := -Wall,-Wno-unused-function$(if $(HOSTCC),,$(comma)-Wno-format-truncation)
NVFLAGS += -Xcompiler $(HOSTWARN) -diag-suppress 177
LDLIBS := -lm

SUFFIX ?=

all: qwen$(SUFFIX) trained

# The compiler and flags of the last build, in a file: a build with another NVCC or ARCH rebuilds
# everything (without it, `make ARCH=sm_70` after `make` would find ./qwen up to date). The file
# is rewritten only when they change, so an unchanged build stays up to date.
BUILD_FLAGS := $(NVCC) $(NVFLAGS)
.build-flags$(SUFFIX): FORCE
	@echo '$(BUILD_FLAGS)' | cmp -s - $@ || echo '$(BUILD_FLAGS)' > $@
FORCE:

# The build's commit for --version: `git describe --always --dirty` (the commit's short hash, with
# -dirty when the sources differ from it), or "unknown" outside a git checkout. It is kept in
# .version, rewritten only when it changes, so that a new commit rebuilds ./qwen and nothing else.
QWEN_VERSION := $(shell git -C "$(CURDIR)" describe --always --dirty 2>/dev/null || echo unknown)
.version$(SUFFIX): FORCE
	@echo '$(QWEN_VERSION)' | cmp -s - $@ || echo '$(QWEN_VERSION)' > $@

qwen$(SUFFIX): qwen.cu tokenizer.c unicode_tables.h .build-flags$(SUFFIX) .version$(SUFFIX)
	$(NVCC_RUN) $(NVFLAGS) -DQWEN_VERSION='"$(QWEN_VERSION)"' -o $@ qwen.cu $(LDLIBS)

# the tests #include qwen.cu with TESTING defined (no main of its own)
test/test_qwen$(SUFFIX): test/test_qwen.cu test/gguf_write.h test/test_quantize.h test/quantize.h \
		test/test_trained.h test/test_hidden.h test/fuzz_targets.h \
		qwen.cu tokenizer.c unicode_tables.h .build-flags$(SUFFIX)
	$(NVCC_RUN) $(NVFLAGS) -o $@ test/test_qwen.cu $(LDLIBS)

# test/quantize remakes the trained models' quantized files and a Q8_0 of them (test_trained.h)
test: qwen$(SUFFIX) test/test_qwen$(SUFFIX) test/quantize$(SUFFIX) trained
	QWEN_BIN=./qwen$(SUFFIX) QUANTIZE_BIN=./test/quantize$(SUFFIX) ./test/test_qwen$(SUFFIX)

clean:
	rm -f qwen qwen-sm70 test/test_qwen test/test_qwen-sm70 test/step_floor test/bench test/bench-sm70 \
		qwen-san test/test_qwen-san test/fuzz_mutate .build-flags .build-flags-sm70 .version \
		.version-sm70 \
		test/quantize test/quantize-sm70 \
		test/train/hf_to_gguf test/train/hf_to_gguf-sm70 \
		test/fuzz_lib $(FUZZ_TARGETS:%=test/fuzz-%) $(TRAINED_Q)

.PHONY: all test clean trained bench bench-tokenizer unicode-check sanitize fuzz fuzz-lib FORCE

# synthetic full-size models for benchmarks: test/gen_model --model qwen2.5-32b --ftype iq4_xs -o F.gguf
test/gen_model$(SUFFIX): test/gen_model.cu test/gguf_write.h qwen.cu tokenizer.c .build-flags$(SUFFIX)
	$(NVCC_RUN) $(NVFLAGS) -o $@ test/gen_model.cu $(LDLIBS) -lpthread

# a checkpoint of our training script to an F16 GGUF as llama.cpp's converter writes it:
# test/train/hf_to_gguf CKPT_DIR VOCAB.gguf N_VOCAB_TOKENS OUT.gguf (its header says more)
test/train/hf_to_gguf$(SUFFIX): test/train/hf_to_gguf.cu test/gguf_write.h qwen.cu tokenizer.c \
		unicode_tables.h .build-flags$(SUFFIX)
	$(NVCC_RUN) $(NVFLAGS) -o $@ test/train/hf_to_gguf.cu $(LDLIBS)

# quantize a GGUF with llama-quantize's type mix and this repository's encoders (test/quantize.h):
# test/quantize IN.gguf OUT.gguf q8_0|q4_0|iq4_xs
test/quantize$(SUFFIX): test/quantize.cu test/quantize.h test/gguf_write.h qwen.cu tokenizer.c \
		.build-flags$(SUFFIX)
	$(NVCC_RUN) $(NVFLAGS) -o $@ test/quantize.cu $(LDLIBS)

# The trained models' quantized files (test/data/trained/*-q4_0.gguf, *-iq4_xs.gguf) are made
# here from the committed F16 files, not committed: test/quantize writes the same bytes on every
# machine, and the tests hold them to the sha256 sums in test/data/trained/quantized.sha256 (the
# files the README's figures were measured on). make trained makes the four; test/quantize prints
# a line per tensor, shown only when it fails.
TRAINED_Q := $(foreach a,qwen3 qwen35,$(foreach t,q4_0 iq4_xs,test/data/trained/$(a)-$(t).gguf))
trained: $(TRAINED_Q)
QUANTIZE_TRAINED = @echo "./test/quantize$(SUFFIX) $< $@ $(1)"; \
	log=$$(./test/quantize$(SUFFIX) $< $@ $(1) 2>&1) || { echo "$$log" >&2; exit 1; }
$(filter %-q4_0.gguf,$(TRAINED_Q)): %-q4_0.gguf: %-f16.gguf test/quantize$(SUFFIX)
	$(call QUANTIZE_TRAINED,q4_0)
$(filter %-iq4_xs.gguf,$(TRAINED_Q)): %-iq4_xs.gguf: %-f16.gguf test/quantize$(SUFFIX)
	$(call QUANTIZE_TRAINED,iq4_xs)

# the floor of a decode token's chain of steps with ideal kernels (GPU only): test/step_floor [shape]
test/step_floor: test/step_floor.cu test/graph_ms.h qwen.cu tokenizer.c unicode_tables.h .build-flags
	$(NVCC_RUN) $(NVFLAGS) -o $@ test/step_floor.cu $(LDLIBS)

# the measurements behind the engine's choices (GPU only): per-kernel tables, mat-vec kinds, size
# sweeps. make bench builds test/bench; make bench MODEL=model.gguf also runs it
test/bench$(SUFFIX): test/bench.cu test/graph_ms.h qwen.cu tokenizer.c unicode_tables.h \
		.build-flags$(SUFFIX)
	$(NVCC_RUN) $(NVFLAGS) -o $@ test/bench.cu $(LDLIBS)
bench: test/bench$(SUFFIX)
	@if [ -n "$(MODEL)" ]; then ./test/bench$(SUFFIX) -m $(MODEL); fi

# tokenizer speed: ~1 MB of mixed text (the tokenizer test strings: English, code, CJK, Cyrillic,
# Khmer, emoji, whitespace runs, repeated) through ./qwen --tokenize with the full Qwen2 vocabulary
MIXED := /tmp/qwen-mixed-text.txt
bench-tokenizer: qwen$(SUFFIX)
	@rm -f $(MIXED); while [ $$(stat -c%s $(MIXED) 2>/dev/null || echo 0) -lt 1048576 ]; do \
		cat test/data/tokenizer/ggml-vocab-qwen2.gguf.inp test/data/tokenizer/ggml-vocab-qwen35.gguf.inp >> $(MIXED); done
	@for i in 1 2 3; do ./qwen$(SUFFIX) -m test/data/tokenizer/vocab-qwen2.gguf --tokenize -f $(MIXED) > /dev/null; done

# unicode_tables.h is generated: check that it matches unicode_tables.py and the installed UCD
unicode-check:
	python3 unicode_tables.py | cmp - unicode_tables.h && echo "unicode_tables.h is up to date"

# ---- sanitizers and fuzzing (the CPU path; CI's machine kind needs no GPU) ----
#   make sanitize          the tests built with AddressSanitizer and UBSan (test/sanitize.sh)
#   make fuzz [FUZZ_S=60]  mutated fixtures through ./qwen-san for FUZZ_S seconds (test/fuzz.sh)
#   make fuzz-lib [FUZZ_S=60]  every reader under libFuzzer, in process, FUZZ_S/5 seconds each on
#                          all cores (test/fuzz_lib.sh; the targets are in test/fuzz_targets.h)
# Separate binaries: qwen-san, test/test_qwen-san. NVFLAGS with -O1 -g in place of -O3; each
# -fsanitize in its own -Xcompiler (nvcc splits an -Xcompiler value at commas). nvcc hands them to
# the host compiler's link step too, which links the sanitizer runtimes.
SANFLAGS = $(filter-out -O%,$(NVFLAGS)) -O1 -g -Xcompiler -fno-omit-frame-pointer \
	-Xcompiler -fsanitize=address -Xcompiler -fsanitize=undefined
FUZZ_S ?= 60

qwen-san: qwen.cu tokenizer.c unicode_tables.h .version$(SUFFIX)
	$(NVCC_RUN) $(SANFLAGS) -DQWEN_VERSION='"$(QWEN_VERSION)"' -o $@ qwen.cu $(LDLIBS)

test/test_qwen-san: test/test_qwen.cu test/gguf_write.h test/test_quantize.h test/quantize.h \
		test/test_trained.h test/test_hidden.h test/fuzz_targets.h \
		qwen.cu tokenizer.c unicode_tables.h
	$(NVCC_RUN) $(SANFLAGS) -o $@ test/test_qwen.cu $(LDLIBS)

test/fuzz_mutate: test/fuzz_mutate.c
	$(CC) -O2 -Wall -Wextra -o $@ test/fuzz_mutate.c

sanitize: qwen-san test/test_qwen-san test/quantize trained
	test/sanitize.sh

fuzz: qwen-san test/fuzz_mutate
	FUZZ_S=$(FUZZ_S) test/fuzz.sh

# test/fuzz_lib: the libFuzzer targets in one binary, built by nvcc with clang++-14 as the host
# compiler (libFuzzer comes with clang: -fsanitize=fuzzer links its main). Its links
# test/fuzz-gguf, -vocab, -text, -kld, -args choose the target by name. A UBSan report aborts, as
# an ASan report does; test/fuzz_ignorelist.txt leaves out the checks of known, unfixed bugs.
FUZZ_CXX ?= clang++-14
FUZZ_TARGETS := gguf vocab text kld args
FUZZFLAGS = -std=c++17 -O1 -g -gencode arch=compute_$(SM),code=sm_$(SM) -cudart static \
	-ccbin $(FUZZ_CXX) -Xcompiler -Wall,-Wno-unused-function -diag-suppress 177 \
	-Xcompiler -fno-omit-frame-pointer -Xcompiler -fsanitize=fuzzer -Xcompiler -fsanitize=address \
	-Xcompiler -fsanitize=undefined -Xcompiler -fno-sanitize-recover=all \
	-Xcompiler -fsanitize-ignorelist=$(CURDIR)/test/fuzz_ignorelist.txt

test/fuzz_lib: test/fuzz_main.cu test/fuzz_targets.h test/fuzz_ignorelist.txt qwen.cu tokenizer.c \
		unicode_tables.h .build-flags
	$(NVCC_RUN) $(FUZZFLAGS) -o $@ test/fuzz_main.cu $(LDLIBS)
	for t in $(FUZZ_TARGETS); do ln -sf fuzz_lib test/fuzz-$$t; done

fuzz-lib: test/fuzz_lib
	FUZZ_S=$(FUZZ_S) test/fuzz_lib.sh
