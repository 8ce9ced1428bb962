/* fa_bytes.h - big-endian (network order) fields in byte buffers, alignment-free: the SP framing
 * of the daemon's transport and the SHA-256 of the kernel cache read and write them. Internal. */
#ifndef FA_BYTES_H
#define FA_BYTES_H

#include <stdint.h>

/* The big-endian 32-bit value at p. */
static inline uint32_t fa_get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The big-endian 64-bit value at p. */
static inline uint64_t fa_get_be64(const uint8_t *p)
{
	return (uint64_t)fa_get_be32(p) << 32 | fa_get_be32(p + 4);
}

/* Store v big-endian at p (4 bytes). */
static inline void fa_put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* Store v big-endian at p (8 bytes). */
static inline void fa_put_be64(uint8_t *p, uint64_t v)
{
	fa_put_be32(p, (uint32_t)(v >> 32));
	fa_put_be32(p + 4, (uint32_t)v);
}

#endif /* FA_BYTES_H */
