/* libFuzzer harness for tap_table_validate, tap_table_to_json, the iterator and tap_table_find: a table that
 * validates must render, and iterate to its end without an error; a key that is not found leaves nothing. */
#include "amqptap/jsonl.h"
#include "amqptap/table.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int rc = tap_table_validate(data, size);
	struct tap_buf b;
	struct tap_json j;
	tap_buf_init(&b);
	tap_json_init(&j, &b);
	if (tap_table_to_json(&j, data, size) != rc)
		abort();
	tap_buf_deinit(&b);
	struct tap_table_it it;
	struct tap_field f;
	tap_table_it_init(&it, data, size);
	int n;
	while ((n = tap_table_next(&it, &f)) == 1)
		;
	if (rc == 0 && n != 0)
		abort();
	(void)tap_array_validate(data, size);
	if (!tap_table_find(data, size, "PASSWORD", &f) && (f.ptr || f.name || f.len || f.type))
		abort();
	return 0;
}
