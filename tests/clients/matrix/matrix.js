// The client-matrix cases (tests/integration/test_client_matrix.py) with node's amqplib: every publish on a
// confirm channel, one JSON line per publish on stdout saying what the library itself reported.
// Usage: node matrix.js URL EXCHANGE MISSING_EXCHANGE PREFIX
'use strict';
const amqp = require('amqplib/callback_api');

const [url, exchange, missing, prefix] = process.argv.slice(2);

function report(messageId, outcome) {
  process.stdout.write(JSON.stringify({message_id: messageId, outcome}) + '\n');
}

function die(err) {
  process.stderr.write(`matrix_node: ${err}\n`);
  process.exit(1);
}

// One publish; calls done() once the library has answered ("returned+ack", "ack", "nack" or "closed:CODE").
function publish(ch, ex, key, messageId, mandatory, done) {
  let returned = false;
  let answered = false;
  const finish = (what) => {
    if (answered) return;
    answered = true;
    ch.removeListener('return', onReturn);
    ch.removeListener('error', onError);
    report(messageId, what);
    done();
  };
  const onReturn = (msg) => {
    if (msg.properties.messageId === messageId) returned = true;
  };
  const onError = (err) => finish(`closed:${err.code}`);
  ch.on('return', onReturn);
  ch.on('error', onError);
  ch.publish(ex, key, Buffer.from(`matrix ${messageId}`), {messageId, mandatory}, (err) => {
    // amqplib calls back with an error for a nack, and also when the channel closes with the publish
    // unconfirmed; the channel's 'error' event (with the broker's code) comes first in that case.
    setImmediate(() => finish((returned ? 'returned+' : '') + (err ? 'nack' : 'ack')));
  });
}

amqp.connect(url, (err, conn) => {
  if (err) die(err);
  conn.on('error', () => {});
  conn.createConfirmChannel((err, ch) => {
    if (err) die(err);
    const steps = [
      (next) => publish(ch, exchange, 'ok', prefix + 'routable', true, next),
      (next) => publish(ch, exchange, 'nomatch', prefix + 'unroutable-mandatory', true, next),
      (next) => publish(ch, exchange, 'nomatch', prefix + 'unroutable-plain', false, next),
      (next) => publish(ch, exchange, 'full', prefix + 'fills-queue', true, next),
      (next) => publish(ch, exchange, 'full', prefix + 'overflow', true, next),
      (next) => conn.createConfirmChannel((err, ch2) => {
        if (err) die(err);
        publish(ch2, missing, 'ok', prefix + 'missing-exchange', true, next);
      }),
    ];
    const run = (i) => {
      if (i === steps.length) {
        ch.close(() => conn.close());
        return;
      }
      steps[i](() => run(i + 1));
    };
    run(0);
  });
});
