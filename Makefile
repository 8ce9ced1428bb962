# fa — the only Makefile. Out-of-tree builds under $(BUILD); quiet unless V=1; SAN=1 for
# ASan+UBSan; PREFIX/DESTDIR for install. `make help` lists the targets.
#
# Parts (each folder's README says more):
#   common/   -> $(BUILD)/libfacommon.a    types, statuses, request checks, CUDA driver shim (all parts)
#   proto/    -> $(BUILD)/libfaproto.a     wire contract (msgpack-c)
#   kernels/  -> $(BUILD)/libfakernels.a   CPU reference, planner, GPU launcher (CUDA loaded at run time)
#   client/   -> libfaclient.so.$(MAJOR), libfaclient.a, libfaclient.pc (nanomsg)
#   ctl/      -> $(BUILD)/fa-ctl           the command-line tool (libfaclient + kernels/)
#   daemon/   -> fa-daemon (libuv; its own SP/IPC transport: daemon/README.md says why not NNG);
#                daemon/gpu/ is its GPU backend, compiled in like the rest
#   tests/    -> unit, daemon, integ, gpu, bench, fuzz programs

BUILD   ?= build
PREFIX  ?= /usr/local
DESTDIR ?=
CC      ?= cc
PKG_CONFIG ?= pkg-config
CUDA_HOME ?= /usr/local/cuda
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
SYSTEMDUSERUNITDIR ?= $(PREFIX)/lib/systemd/user

ifeq ($(V),1)
Q :=
msg = @true
else
Q := @
msg = @printf '  %-7s %s\n' $(1) $(2)
endif

# ---- version, from the public types header -----------------------------------------------------
# The installed headers: fa_client.h includes fa_types.h, which lives in common/ (every part uses
# it; -Icommon finds it in the tree) and is installed beside fa_client.h (found there by the
# quoted include).
HDR := client/include/fa/fa_client.h
TYPES_HDR := common/fa_types.h
VMAJOR := $(shell awk '/define FA_VERSION_MAJOR/{print $$3}' $(TYPES_HDR))
VMINOR := $(shell awk '/define FA_VERSION_MINOR/{print $$3}' $(TYPES_HDR))
VPATCH := $(shell awk '/define FA_VERSION_PATCH/{print $$3}' $(TYPES_HDR))
VERSION := $(VMAJOR).$(VMINOR).$(VPATCH)

# ---- libraries through pkg-config (plain -l fallbacks) -------------------------------------------
pc_cflags = $(shell $(PKG_CONFIG) --cflags $(1) 2>/dev/null)
pc_libs   = $(shell $(PKG_CONFIG) --libs $(1) 2>/dev/null)
MSGPACK_PC := $(shell $(PKG_CONFIG) --exists msgpack-c 2>/dev/null && echo msgpack-c || echo msgpack)
MSGPACK_CFLAGS := $(call pc_cflags,$(MSGPACK_PC))
MSGPACK_LIBS   := $(or $(call pc_libs,$(MSGPACK_PC)),-lmsgpackc)
UV_CFLAGS   := $(call pc_cflags,libuv)
UV_LIBS     := $(or $(call pc_libs,libuv),-luv)
NN_CFLAGS   := $(call pc_cflags,nanomsg)
NN_LIBS     := $(or $(call pc_libs,nanomsg),-lnanomsg)
CMOCKA_CFLAGS := $(call pc_cflags,cmocka)
CMOCKA_LIBS   := $(or $(call pc_libs,cmocka),-lcmocka)
SYSTEMD_CFLAGS := $(shell $(PKG_CONFIG) --exists libsystemd 2>/dev/null && echo -DFA_HAVE_SYSTEMD $(call pc_cflags,libsystemd))
SYSTEMD_LIBS   := $(if $(SYSTEMD_CFLAGS),$(call pc_libs,libsystemd))
# CUDA: headers only at build time (types and enums); libcuda.so.1 and libnvrtc are loaded with
# dlopen at run time so every program starts on machines without a driver.
CUDA_CFLAGS := $(if $(wildcard $(CUDA_HOME)/include/cuda.h),-I$(CUDA_HOME)/include -DFA_HAVE_CUDA_HEADERS)

# ---- flags ---------------------------------------------------------------------------------------
WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-missing-field-initializers
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -fPIC $(WARN) -Iclient/include -Icommon -Iproto -Ikernels \
               -I$(BUILD)/gen -DFA_CUDA_HOME='"$(CUDA_HOME)"'
ifeq ($(SAN),1)
BASE_CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
SAN_LDFLAGS := -fsanitize=address,undefined
endif
ifeq ($(WERROR),1)
BASE_CFLAGS += -Werror
endif
ALL_CFLAGS = $(BASE_CFLAGS) $(CFLAGS)
ALL_LDFLAGS = $(SAN_LDFLAGS) $(LDFLAGS)
SYS_LIBS := -lpthread -ldl -lm -lrt

# ---- sources -------------------------------------------------------------------------------------
COMMON_SRC  := $(wildcard common/*.c)
PROTO_SRC   := $(wildcard proto/*.c)
KERNELS_SRC := $(wildcard kernels/*.c)
KERNELS_CU  := $(wildcard kernels/*.cu)
KERNELS_CUH := $(wildcard kernels/*.cuh)
CLIENT_SRC  := $(wildcard client/*.c)
CTL_SRC     := $(wildcard ctl/*.c)
DAEMON_SRC  := $(wildcard daemon/*.c daemon/gpu/*.c)
DAEMON_MAIN := daemon/main.c
HELPER_SRC  := $(wildcard tests/helpers/*.c)

obj = $(patsubst %.c,$(BUILD)/%.o,$(1))
COMMON_OBJ  := $(call obj,$(COMMON_SRC))
PROTO_OBJ   := $(call obj,$(PROTO_SRC))
# The CUDA sources are embedded as C strings for NVRTC (kernels/*.cu -> $(BUILD)/gen/*_cu.c, and
# the header both include, kernels/*.cuh -> $(BUILD)/gen/*_cuh.c, handed to NVRTC as a header).
KERNELS_GEN := $(patsubst kernels/%.cu,$(BUILD)/gen/%_cu.c,$(KERNELS_CU)) \
               $(patsubst kernels/%.cuh,$(BUILD)/gen/%_cuh.c,$(KERNELS_CUH))
KERNELS_OBJ := $(call obj,$(KERNELS_SRC)) $(KERNELS_GEN:.c=.o)
.SECONDARY: $(KERNELS_GEN)
CLIENT_OBJ  := $(call obj,$(CLIENT_SRC))
CTL_OBJ     := $(call obj,$(CTL_SRC))
DAEMON_OBJ  := $(call obj,$(DAEMON_SRC))
DAEMON_LIBOBJ := $(filter-out $(call obj,$(DAEMON_MAIN)),$(DAEMON_OBJ))
HELPER_OBJ  := $(call obj,$(HELPER_SRC))

LIBCOMMON  := $(BUILD)/libfacommon.a
LIBPROTO   := $(BUILD)/libfaproto.a
LIBKERNELS := $(BUILD)/libfakernels.a
LIBCLIENT_A  := $(BUILD)/libfaclient.a
LIBCLIENT_SO := $(BUILD)/libfaclient.so.$(VERSION)
LIBCLIENT_SONAME := libfaclient.so.$(VMAJOR)
CLIENT_PC  := $(BUILD)/libfaclient.pc
DAEMON_BIN := $(BUILD)/fa-daemon
CTL_BIN    := $(BUILD)/fa-ctl

# Tests: one program per file; the folder decides what it links. Nothing links NNG any more; keep
# it that way: libnng exports nn_* symbols too, so nanomsg and NNG in one binary break each other.
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
DTEST_SRC  := $(wildcard tests/daemon/test_*.c)
INTEG_SRC  := $(wildcard tests/integ/test_*.c)
GPU_SRC    := $(wildcard tests/gpu/test_*.c)
BENCH_SRC  := $(wildcard tests/bench/*.c)
DEMO_SRC   := $(wildcard tests/demo/*.c)
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
prog = $(patsubst %.c,$(BUILD)/%,$(1))
UNIT_BIN  := $(call prog,$(UNIT_SRC))
DTEST_BIN := $(call prog,$(DTEST_SRC))
INTEG_BIN := $(call prog,$(INTEG_SRC))
GPU_BIN   := $(call prog,$(GPU_SRC))
BENCH_BIN := $(call prog,$(BENCH_SRC))
DEMO_BIN  := $(call prog,$(DEMO_SRC))
TEST_BINS := $(UNIT_BIN) $(DTEST_BIN) $(INTEG_BIN) $(GPU_BIN)

.PHONY: sass-dump all deps check-deps check-cycles test test-quick test-python test-san test-gpu test-gpu-full bench demo \
        fuzz fuzz-run install install-systemd uninstall clean help
.DEFAULT_GOAL := all

all: $(DAEMON_BIN) $(CTL_BIN) $(LIBCLIENT_SO) $(LIBCLIENT_A) $(CLIENT_PC) $(TEST_BINS) $(BENCH_BIN) $(DEMO_BIN)

help:
	@echo "make deps           install the Debian packages (root) or print the command"
	@echo "make                build daemon, client library, fa-ctl, tests and benchmarks into $(BUILD)/"
	@echo "make demo           daemon + 4 client processes doing attention, checked, with a table"
	@echo "make test           every test (unit, daemon, integration, GPU or skipped, sanitizers, fuzz)"
	@echo "make test-quick     the tests without the sanitizer rebuild and fuzzing"
	@echo "make test-python    the Python package's tests (python/; make test-quick runs them)"
	@echo "make check-cycles   fail on a call cycle between source files (test-quick runs it)"
	@echo "make test-gpu-full  the full GPU grid (on a GPU host)"
	@echo "make bench          the benchmarks (latency; kernel TFLOP/s on a GPU host)"
	@echo "make fuzz           the decoder fuzzer for FUZZ_SECONDS (default 60) with clang"
	@echo "make install        PREFIX=$(PREFIX) DESTDIR=$(DESTDIR)"
	@echo "options: V=1 (commands), SAN=1 (ASan+UBSan), BUILD=dir, WERROR=1"

# ---- dependencies -------------------------------------------------------------------------------
deps:
	$(Q)sh tools/deps.sh install

check-deps:
	$(Q)sh tools/deps.sh check

# ---- compile rules -------------------------------------------------------------------------------
# common/ objects go into every program and into libfaclient.so (hidden, like proto/'s).
$(BUILD)/common/%.o: common/%.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D) && $(CC) $(ALL_CFLAGS) -fvisibility=hidden $(CUDA_CFLAGS) -MMD -MP -c $< -o $@

# proto/ objects go into libfaclient.so too: hidden, so the .so exports only FA_API declarations.
$(BUILD)/proto/%.o: proto/%.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D) && $(CC) $(ALL_CFLAGS) -fvisibility=hidden $(MSGPACK_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/kernels/%.o: kernels/%.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D) && $(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/gen/%_cu.c: kernels/%.cu tools/embed.sh
	$(call msg,EMBED,$<)
	$(Q)mkdir -p $(@D) && sh tools/embed.sh $< fa_src_$(subst -,_,$*) > $@

$(BUILD)/gen/%_cuh.c: kernels/%.cuh tools/embed.sh
	$(call msg,EMBED,$<)
	$(Q)mkdir -p $(@D) && sh tools/embed.sh $< fa_src_$(subst -,_,$*) > $@

$(BUILD)/gen/%.o: $(BUILD)/gen/%.c
	$(call msg,CC,$<)
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/client/%.o: client/%.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D) && $(CC) $(ALL_CFLAGS) -fvisibility=hidden $(NN_CFLAGS) $(CUDA_CFLAGS) -MMD -MP -c $< -o $@

# fa-ctl: a client of the public API that also links kernels/ (plan, tune); nothing hidden.
$(BUILD)/ctl/%.o: ctl/%.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D) && $(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/daemon/%.o: daemon/%.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D) && $(CC) $(ALL_CFLAGS) $(UV_CFLAGS) $(SYSTEMD_CFLAGS) $(CUDA_CFLAGS) -Idaemon -MMD -MP -c $< -o $@

$(BUILD)/tests/%.o: tests/%.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D) && $(CC) $(ALL_CFLAGS) $(CMOCKA_CFLAGS) $(NN_CFLAGS) $(UV_CFLAGS) $(CUDA_CFLAGS) -Idaemon -Itests/helpers -MMD -MP -c $< -o $@

# ---- libraries and programs ---------------------------------------------------------------------
$(LIBCOMMON): $(COMMON_OBJ)
	$(call msg,AR,$@)
	$(Q)mkdir -p $(@D) && rm -f $@ && ar rcs $@ $^

$(LIBPROTO): $(PROTO_OBJ)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBKERNELS): $(KERNELS_OBJ)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBCLIENT_A): $(CLIENT_OBJ) $(PROTO_OBJ) $(COMMON_OBJ)
	$(call msg,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBCLIENT_SO): $(CLIENT_OBJ) $(PROTO_OBJ) $(COMMON_OBJ)
	$(call msg,LD,$@)
	$(Q)$(CC) -shared -Wl,-soname,$(LIBCLIENT_SONAME) -Wl,--no-undefined $(ALL_LDFLAGS) -o $@ $^ \
		$(NN_LIBS) $(MSGPACK_LIBS) $(SYS_LIBS)
	$(Q)ln -sf libfaclient.so.$(VERSION) $(BUILD)/$(LIBCLIENT_SONAME)
	$(Q)ln -sf $(LIBCLIENT_SONAME) $(BUILD)/libfaclient.so

$(CLIENT_PC): client/libfaclient.pc.in $(TYPES_HDR)
	$(call msg,GEN,$@)
	$(Q)mkdir -p $(@D) && sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' $< > $@

$(DAEMON_BIN): $(DAEMON_OBJ) $(LIBKERNELS) $(LIBPROTO) $(LIBCOMMON)
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(DAEMON_OBJ) $(LIBKERNELS) $(LIBPROTO) $(LIBCOMMON) $(UV_LIBS) \
		$(MSGPACK_LIBS) $(SYSTEMD_LIBS) $(SYS_LIBS)

$(CTL_BIN): $(CTL_OBJ) $(LIBCLIENT_A) $(LIBKERNELS) $(LIBCOMMON)
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(CTL_OBJ) $(LIBCLIENT_A) $(LIBKERNELS) $(LIBCOMMON) $(NN_LIBS) $(MSGPACK_LIBS) $(SYS_LIBS)

# tests/unit: pure code (proto, kernels' C parts)
$(UNIT_BIN): %: %.o $(HELPER_OBJ) $(LIBKERNELS) $(LIBPROTO) $(LIBCOMMON)
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(CMOCKA_LIBS) $(MSGPACK_LIBS) $(SYS_LIBS)

# tests/daemon: the daemon's own parts without main(), spoken to by nanomsg REQ clients
$(DTEST_BIN): %: %.o $(DAEMON_LIBOBJ) $(HELPER_OBJ) $(LIBKERNELS) $(LIBPROTO) $(LIBCOMMON)
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(CMOCKA_LIBS) $(UV_LIBS) $(NN_LIBS) $(MSGPACK_LIBS) $(SYSTEMD_LIBS) $(SYS_LIBS)

# tests/integ, bench, demo: real client processes (nanomsg side) against the real fa-daemon binary
$(INTEG_BIN): %: %.o $(HELPER_OBJ) $(LIBCLIENT_A) $(LIBKERNELS) $(LIBCOMMON) | $(DAEMON_BIN) $(CTL_BIN)
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(CMOCKA_LIBS) $(NN_LIBS) $(MSGPACK_LIBS) $(SYS_LIBS)

$(BENCH_BIN): %: %.o $(HELPER_OBJ) $(LIBCLIENT_A) $(LIBKERNELS) $(LIBCOMMON) | $(DAEMON_BIN)
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(CMOCKA_LIBS) $(NN_LIBS) $(MSGPACK_LIBS) $(SYS_LIBS)

$(DEMO_BIN): %: %.o $(HELPER_OBJ) $(LIBCLIENT_A) $(LIBKERNELS) $(LIBCOMMON) | $(DAEMON_BIN)
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(CMOCKA_LIBS) $(NN_LIBS) $(MSGPACK_LIBS) $(SYS_LIBS)

# tests/gpu: kernels and their launcher in-process (CUDA loaded at run time; skipped without a GPU)
$(GPU_BIN): %: %.o $(HELPER_OBJ) $(LIBKERNELS) $(LIBPROTO) $(LIBCOMMON)
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(CMOCKA_LIBS) $(MSGPACK_LIBS) $(SYS_LIBS)

# tools/sass-dump: cubins of a fixed list of specialisations, to compare SASS between trees
# (tools/sass-diff.sh); not part of all.
SASS_DUMP := $(BUILD)/tools/sass-dump
sass-dump: $(SASS_DUMP)
$(SASS_DUMP): $(BUILD)/tools/sass-dump.o $(LIBKERNELS) $(LIBPROTO) $(LIBCOMMON)
	$(call msg,LD,$@)
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(SYS_LIBS)

$(BUILD)/tools/%.o: tools/%.c
	$(call msg,CC,$<)
	$(Q)mkdir -p $(@D) && $(CC) $(ALL_CFLAGS) $(CUDA_CFLAGS) -MMD -MP -c $< -o $@

# ---- tests ---------------------------------------------------------------------------------------
# test-quick: every test program once. test: that, then the sanitizer build's tests and the fuzzer.
# The dependency check runs first and the build is a sub-make: pkg-config's answers are read when
# a Makefile is parsed, so they must be read after a fresh machine installed the libraries.
test-quick: check-deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)sh tools/cycles.sh $(BUILD)
	$(Q)sh tests/run.sh $(BUILD) $(TEST_BINS)
	$(Q)sh tests/install-check.sh $(BUILD)
	$(Q)sh python/tests/run.sh $(BUILD)

# The Python package (python/): its tests against this build's library and daemon.
test-python: all
	$(Q)sh python/tests/run.sh $(BUILD)

test: test-quick
	$(Q)$(MAKE) --no-print-directory SAN=1 BUILD=$(BUILD)-san test-san
	$(Q)$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(or $(FUZZ_SECONDS),60)

# No two source files may call each other in a loop (daemon/README.md, "Who calls whom").
check-cycles: all
	$(Q)sh tools/cycles.sh $(BUILD)

test-san: all
	$(Q)sh tests/run.sh $(BUILD) $(TEST_BINS)

test-gpu-full: all
	$(Q)FA_GPU_GRID=full sh tests/run.sh $(BUILD) $(GPU_BIN)

bench: all
	$(Q)for b in $(BENCH_BIN); do echo "== $$b"; $$b || exit 1; done

demo: check-deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)sh tests/demo/run-demo.sh $(BUILD)

# libFuzzer needs clang; the decoder is built with its own objects, never with the SAN build's.
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZ_BIN := $(call prog,$(FUZZ_SRC))
# Without clang's libFuzzer (a host with no package registry) fuzzing is skipped, loudly; under
# CI=true that is a failure.
fuzz:
	$(Q)if sh tools/have-fuzzer.sh; then \
		$(MAKE) --no-print-directory fuzz-run; \
	elif [ "$(CI)" = true ]; then \
		echo "fuzz: clang with libFuzzer is missing (make deps installs it)"; exit 1; \
	else \
		echo "  SKIP    fuzzing: clang with libFuzzer is not installed here (make deps)"; \
	fi

fuzz-run: $(FUZZ_BIN)
	$(Q)for f in $(FUZZ_BIN); do sh tests/fuzz/run-fuzz.sh $$f $(FUZZ_SECONDS) || exit 1; done

$(FUZZ_BIN): $(BUILD)/tests/fuzz/%: tests/fuzz/%.c $(PROTO_SRC) $(COMMON_SRC) $(wildcard proto/*.h common/*.h)
	$(call msg,FUZZ,$@)
	$(Q)mkdir -p $(@D) && $(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
		-Iclient/include -Icommon -Iproto $(MSGPACK_CFLAGS) $(CUDA_CFLAGS) -o $@ $< $(PROTO_SRC) $(COMMON_SRC) \
		$(MSGPACK_LIBS) $(SYS_LIBS)

# ---- install -------------------------------------------------------------------------------------
install: $(DAEMON_BIN) $(CTL_BIN) $(LIBCLIENT_SO) $(LIBCLIENT_A) $(CLIENT_PC)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include/fa
	install -m 755 $(DAEMON_BIN) $(CTL_BIN) $(DESTDIR)$(PREFIX)/bin/
	install -m 755 $(LIBCLIENT_SO) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libfaclient.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(LIBCLIENT_SONAME)
	ln -sf $(LIBCLIENT_SONAME) $(DESTDIR)$(PREFIX)/lib/libfaclient.so
	install -m 644 $(LIBCLIENT_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(HDR) $(TYPES_HDR) $(DESTDIR)$(PREFIX)/include/fa/
	@# Written here, not copied from $(BUILD): the .pc names PREFIX, which may differ from the build's.
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' client/libfaclient.pc.in \
		> $(DESTDIR)$(PREFIX)/lib/pkgconfig/libfaclient.pc

install-systemd:
	install -d $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(SYSTEMDUSERUNITDIR) $(DESTDIR)$(PREFIX)/lib/sysusers.d $(DESTDIR)$(PREFIX)/lib/tmpfiles.d
	install -m 644 systemd/fa-daemon.service $(DESTDIR)$(SYSTEMDUNITDIR)/
	install -m 644 systemd/fa-daemon-user.service $(DESTDIR)$(SYSTEMDUSERUNITDIR)/fa-daemon.service
	install -m 644 systemd/fa-daemon.sysusers $(DESTDIR)$(PREFIX)/lib/sysusers.d/fa-daemon.conf
	install -m 644 systemd/fa-daemon.tmpfiles $(DESTDIR)$(PREFIX)/lib/tmpfiles.d/fa-daemon.conf

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/fa-daemon $(DESTDIR)$(PREFIX)/bin/fa-ctl \
		$(DESTDIR)$(PREFIX)/lib/libfaclient.* $(DESTDIR)$(PREFIX)/lib/pkgconfig/libfaclient.pc \
		$(DESTDIR)$(PREFIX)/include/fa/fa_client.h $(DESTDIR)$(PREFIX)/include/fa/fa_types.h
	-rmdir $(DESTDIR)$(PREFIX)/include/fa 2>/dev/null

clean:
	rm -rf $(BUILD) $(BUILD)-san

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
