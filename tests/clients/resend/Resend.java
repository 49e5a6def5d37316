// An at-least-once publisher with the RabbitMQ Java client (Debian's librabbitmq-client-java) and its automatic
// connection recovery, for tests/integration/test_resend.py: confirms on, the unconfirmed set kept by sequence
// number; when the connection is lost the set is put aside, and once the library has recovered the connection and
// channel, it is published again. Driven on stdin like resend.go: prints "ready", then on "go" publishes N and
// prints "published", "closed K" when the connection is lost, "done" once the resends are confirmed.
// Usage: java -cp amqp-client.jar:. Resend HOST PORT QUEUE NAME N
import com.rabbitmq.client.*;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentSkipListMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

public class Resend {
    static final ConcurrentSkipListMap<Long, String> pending = new ConcurrentSkipListMap<>();
    static final List<String> lost = new ArrayList<>();

    static void publish(Channel ch, String queue, String id) throws Exception {
        synchronized (pending) {
            pending.put(ch.getNextPublishSeqNo(), id);
            AMQP.BasicProperties p = new AMQP.BasicProperties.Builder().messageId(id).deliveryMode(2).build();
            ch.basicPublish("", queue, p, ("body " + id).getBytes(StandardCharsets.UTF_8));
        }
    }

    static void waitConfirms(long seconds) throws Exception {
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        while (!pending.isEmpty() && System.nanoTime() < end)
            Thread.sleep(20);
        if (!pending.isEmpty())
            throw new RuntimeException("not confirmed: " + pending.size());
    }

    public static void main(String[] a) throws Exception {
        String host = a[0], queue = a[2], name = a[3];
        int port = Integer.parseInt(a[1]), n = Integer.parseInt(a[4]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        ConnectionFactory f = new ConnectionFactory();
        f.setHost(host);
        f.setPort(port);
        f.setAutomaticRecoveryEnabled(true);
        f.setNetworkRecoveryInterval(500);
        Connection conn = f.newConnection(name);
        Channel ch = conn.createChannel();
        ch.confirmSelect();
        ch.addConfirmListener(new ConfirmListener() {
            public void handleAck(long tag, boolean multiple) { done(tag, multiple); }
            public void handleNack(long tag, boolean multiple) { done(tag, multiple); }
            void done(long tag, boolean multiple) {
                synchronized (pending) {
                    if (multiple)
                        pending.headMap(tag, true).clear();
                    else
                        pending.remove(tag);
                }
            }
        });
        CountDownLatch recovered = new CountDownLatch(1);
        ((Recoverable) conn).addRecoveryListener(new RecoveryListener() {
            public void handleRecovery(Recoverable r) { recovered.countDown(); }
            public void handleRecoveryStarted(Recoverable r) { }
        });
        java.util.concurrent.atomic.AtomicBoolean said = new java.util.concurrent.atomic.AtomicBoolean();
        conn.addShutdownListener(cause -> {
            synchronized (pending) { /* the sequence numbers start again on the recovered channel */
                lost.addAll(pending.values());
                pending.clear();
            }
            if (!said.getAndSet(true)) { /* a recovery attempt that fails ends a connection too */
                System.out.println("closed " + lost.size());
                System.out.flush();
            }
        });
        for (int i = 0; i < 10; i++)
            publish(ch, queue, name + "-" + i);
        waitConfirms(30);
        System.out.println("ready");
        System.out.flush();
        if (!"go".equals(in.readLine()))
            throw new RuntimeException("expected go");
        for (int i = 10; i < 10 + n; i++)
            publish(ch, queue, name + "-" + i);
        System.out.println("published");
        System.out.flush();
        if (!recovered.await(60, TimeUnit.SECONDS))
            throw new RuntimeException("not recovered");
        Thread.sleep(200); /* the recovered channel's confirm.select is re-sent during the recovery */
        List<String> again;
        synchronized (pending) {
            again = new ArrayList<>(lost);
        }
        for (String id : again)
            publish(ch, queue, id);
        waitConfirms(30);
        conn.close();
        System.out.println("done");
        System.out.flush();
    }
}
