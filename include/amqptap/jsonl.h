/* JSON Lines building blocks, kept as one include for the modules that build records: the byte buffer (buf.h)
 * and the JSON writer (json.h). Output files are not here: they are I/O and live in out.h (src/io). */
#ifndef AMQPTAP_JSONL_H
#define AMQPTAP_JSONL_H

#include "amqptap/buf.h"
#include "amqptap/json.h"

#endif
