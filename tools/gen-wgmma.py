# gen-wgmma.py - prints the wgmma wrapper functions of kernels/attn_fwd_sm90.cu: m64nNk8 tf32
# (wg_ss_n*, wg_rs_n*) and m64nNk16 16-bit (wg16_ss_n*, wg16_rs_n*, the type is the macro WG16_T,
# "bf16" or "f16"), N = 8..128, A from shared memory by descriptor ("ss") or from registers
# ("rs"), fp32 accumulators, no transposes. Paste the output between the "wgmma wrappers"
# comment and pv_rs in that file.
# --bwd: the 16-bit wrappers of kernels/attn_bwd_sm90.cu instead (wgb_ss_n*, wgb_rs_n*): the
# transpose immediates as template arguments TA, TB (ss) and TB (rs), printed by the "n"
# constraint, so that one wrapper serves K-major and MN-major operands.
# --bwd32: the tf32 wrappers of kernels/attn_bwd_sm90_tf32.cu (wgt_ss_n*, wgt_rs_n*): K-major
# operands only (tf32 has no transpose), the register A fragment as an array.
import sys

out = []
if "--bwd32" in sys.argv[1:]:
    for N in (8, 16, 32, 64, 128):
        nr = N // 2
        shape = "m64n%dk8.f32.tf32.tf32" % N
        accs_ = ", ".join('"+f"(d[%d])' % i for i in range(nr))
        ops_ = ", ".join("%%%d" % i for i in range(nr))
        out.append("__device__ __forceinline__ void wgt_ss_n%d(float *d, u64 da, u64 db)\n{\n" % N)
        out.append('\tasm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n')
        out.append('\t             "wgmma.mma_async.sync.aligned.%s {%s}, %%%d, %%%d, p, 1, 1;\\n}\\n"\n'
                   % (shape, ops_, nr, nr + 1))
        out.append('\t             : %s\n\t             : "l"(da), "l"(db));\n}\n' % accs_)
        out.append("__device__ __forceinline__ void wgt_rs_n%d(float *d, const u32 (&a)[4], u64 db)\n{\n" % N)
        out.append('\tasm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n')
        out.append('\t             "wgmma.mma_async.sync.aligned.%s {%s}, {%%%d, %%%d, %%%d, %%%d}, %%%d, p, 1, 1;\\n}\\n"\n'
                   % (shape, ops_, nr, nr + 1, nr + 2, nr + 3, nr + 4))
        out.append('\t             : %s\n\t             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));\n}\n' % accs_)
    print("".join(out), end="")
    sys.exit(0)
if "--bwd" in sys.argv[1:]:
    for N in (8, 16, 32, 64, 128):
        nr = N // 2
        shape = "m64n%dk16.f32.\" WG16_T \".\" WG16_T \"" % N
        accs_ = ", ".join('"+f"(d[%d])' % i for i in range(nr))
        ops_ = ", ".join("%%%d" % i for i in range(nr))
        out.append("template <int TA, int TB>\n__device__ __forceinline__ void wgb_ss_n%d(float *d, u64 da, u64 db)\n{\n" % N)
        out.append('\tasm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n')
        out.append('\t             "wgmma.mma_async.sync.aligned.%s {%s}, %%%d, %%%d, p, 1, 1, %%%d, %%%d;\\n}\\n"\n'
                   % (shape, ops_, nr, nr + 1, nr + 2, nr + 3))
        out.append('\t             : %s\n\t             : "l"(da), "l"(db), "n"(TA), "n"(TB));\n}\n' % accs_)
        out.append("template <int TB>\n__device__ __forceinline__ void wgb_rs_n%d(float *d, const u32 (&a)[4], u64 db)\n{\n" % N)
        out.append('\tasm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n')
        out.append('\t             "wgmma.mma_async.sync.aligned.%s {%s}, {%%%d, %%%d, %%%d, %%%d}, %%%d, p, 1, 1, %%%d;\\n}\\n"\n'
                   % (shape, ops_, nr, nr + 1, nr + 2, nr + 3, nr + 4, nr + 5))
        out.append('\t             : %s\n\t             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB));\n}\n' % accs_)
    print("".join(out), end="")
    sys.exit(0)


def ops(n, start):
    return ", ".join("%%%d" % (start + i) for i in range(n))


def accs(n):
    return ", ".join('"+f"(d[%d])' % i for i in range(n))


for kind in ("tf32", "16"):
    for N in (8, 16, 32, 64, 128):
        nr = N // 2
        if kind == "tf32":
            name, shape, ty, ss_tail, rs_tail = "wg", "m64n%dk8.f32.tf32.tf32" % N, "", "", ""
        else:
            name, shape = "wg16", "m64n%dk16.f32.\" WG16_T \".\" WG16_T \"" % N
            ss_tail, rs_tail = ", 0, 0", ", 0"
        out.append("__device__ __forceinline__ void %s_ss_n%d(float *d, u64 da, u64 db)\n{\n" % (name, N))
        out.append('\tasm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n')
        out.append('\t             "wgmma.mma_async.sync.aligned.%s {%s}, %%%d, %%%d, p, 1, 1%s;\\n}\\n"\n'
                   % (shape, ops(nr, 0), nr, nr + 1, ss_tail))
        out.append('\t             : %s\n\t             : "l"(da), "l"(db));\n}\n' % accs(nr))
        out.append("__device__ __forceinline__ void %s_rs_n%d(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)\n{\n" % (name, N))
        out.append('\tasm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n')
        out.append('\t             "wgmma.mma_async.sync.aligned.%s {%s}, {%%%d, %%%d, %%%d, %%%d}, %%%d, p, 1, 1%s;\\n}\\n"\n'
                   % (shape, ops(nr, 0), nr, nr + 1, nr + 2, nr + 3, nr + 4, rs_tail))
        out.append('\t             : %s\n\t             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));\n}\n' % accs(nr))
    if kind == "tf32":
        out.append("#if FA_IN != 3\n")
out.append("#endif\n")
print("".join(out), end="")
