/* fa_infer_int.h - the sliding window and softcap of a forward-type call, checked and put on the
 * wire: defined in fa_client.c, used there and by the inference calls (fa_attn_infer.c).
 * Internal.
 */
#ifndef FA_INFER_INT_H
#define FA_INFER_INT_H

#include <stdint.h>

#include "fa_proto.h"

/* Check softcap (finite, >= 0: else FA_EINVAL with this thread's detail set) and fill *w: the
 * window on when `window` is nonzero. */
fa_status fa__window(int32_t window, int64_t left, int64_t right, double softcap,
                     struct fa_proto_window *w);

#endif /* FA_INFER_INT_H */
