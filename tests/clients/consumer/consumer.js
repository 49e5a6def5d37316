// A consumer through the tap (tests/integration/test_consumer.py) with node's amqplib: prefetch 10, manual acks,
// N messages settled by the pattern every client of the test shares: one JSON line per delivery on stdout saying how
// the client settled it.
// Usage: node consumer.js URL QUEUE N
'use strict';
const amqp = require('amqplib');

async function main() {
	const [url, queue, nArg] = process.argv.slice(2);
	const n = Number(nArg);
	const conn = await amqp.connect(url);
	const ch = await conn.createChannel();
	await ch.prefetch(10);
	let i = 0;
	let pending = [];
	const out = (s) => console.log(JSON.stringify(s));
	await new Promise((resolve) => {
		ch.consume(queue, (msg) => {
			if (i >= n)
				return;
			const s = {message_id: msg.properties.messageId, tag: msg.fields.deliveryTag, outcome: null,
				   multiple: false};
			if (i % 10 === 3) {
				s.outcome = 'reject';
				ch.reject(msg, false);
			} else if (i % 10 === 6) {
				s.outcome = 'nack';
				ch.nack(msg, false, false);
			} else if (i % 5 === 4 || i === n - 1) {
				s.outcome = 'ack';
				s.multiple = i % 5 === 4 || pending.length > 0;
				ch.ack(msg, s.multiple);
				for (const p of pending)
					out({...p, outcome: 'ack', multiple: true});
				pending = [];
			} else {
				pending.push(s);
				i++;
				return;
			}
			out(s);
			if (++i === n)
				resolve();
		}, {noAck: false});
	});
	await ch.close();
	await conn.close();
}

main().catch((err) => {
	console.error('consumer.js:', err);
	process.exit(1);
});
