# gen-wgmma.py - prints the wgmma wrapper functions of kernels/attn_fwd_sm90.cu (m64nNk8 tf32,
# N = 8..128, A from shared memory by descriptor ("ss") or from registers ("rs")). Paste the
# output between the "wgmma wrappers" comment and pv_rs in that file.
out=[]
def ops(n, start):
    return ", ".join("%%%d" % (start+i) for i in range(n))
def accs(n):
    return ", ".join('"+f"(d[%d])' % i for i in range(n))
for N in (8,16,32,64,128):
    nr=N//2
    # SS: A and B from shared memory (descriptors)
    out.append("__device__ __forceinline__ void wg_ss_n%d(float *d, u64 da, u64 db)\n{\n" % N)
    out.append('\tasm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n')
    out.append('\t             "wgmma.mma_async.sync.aligned.m64n%dk8.f32.tf32.tf32 {%s}, %%%d, %%%d, p, 1, 1;\\n}\\n"\n' % (N, ops(nr,0), nr, nr+1))
    out.append('\t             : %s\n\t             : "l"(da), "l"(db));\n}\n' % accs(nr))
    # RS: A from registers
    out.append("__device__ __forceinline__ void wg_rs_n%d(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)\n{\n" % N)
    out.append('\tasm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n')
    out.append('\t             "wgmma.mma_async.sync.aligned.m64n%dk8.f32.tf32.tf32 {%s}, {%%%d, %%%d, %%%d, %%%d}, %%%d, p, 1, 1;\\n}\\n"\n' % (N, ops(nr,0), nr, nr+1, nr+2, nr+3, nr+4))
    out.append('\t             : %s\n\t             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));\n}\n' % accs(nr))
print("".join(out), end="")
