/* SPDX-License-Identifier: MIT */
/* Every private header of the proto module at once (the files of exs/proto/ include the
 * module headers they use; tests that reach into the layer include this one). */
#ifndef EXS_PROTO_PROTO_INT_H
#define EXS_PROTO_PROTO_INT_H

#include <sys/socket.h>

#include "exs/proto/batch.h"
#include "exs/proto/conn.h"
#include "exs/proto/dispatch.h"
#include "exs/proto/keepalive.h"
#include "exs/proto/mem.h"
#include "exs/proto/proto.h"
#include "exs/proto/resume.h"
#include "exs/proto/seqpkt.h"
#include "exs/proto/shm_switch.h"
#include "exs/proto/stage.h"
#include "exs/proto/stream.h"

#endif
