// The --fault cases (tests/integration/test_faults.py) with Go's amqp091-go: N mandatory publishes to the default
// exchange with routing key QUEUE on a confirm channel, as fast as the library takes them; then it waits up to
// WAIT_MS for every confirm. One JSON line on stdout says what the library itself reported: the tags it acked and
// nacked (NotifyPublish), the ones it never confirmed, each confirm's time since its publish, and how the
// connection ended (NotifyClose), if it did. FAULTS_HEARTBEAT: the heartbeat in seconds; FAULTS_BODY_BYTES: each
// body that many bytes (publish i: byte k is (i + k) mod 251) instead of "fault i".
// Usage: faults_go URL QUEUE N WAIT_MS
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

type result struct {
	Acks      []uint64           `json:"acks"`
	Nacks     []uint64           `json:"nacks"`
	Missing   []uint64           `json:"missing"`
	ConfirmMs map[string]float64 `json:"confirm_ms"`
	Published int                `json:"published"`
	Closed    string             `json:"closed"`
	Blocked   []string           `json:"blocked"` // NotifyBlocked: "true REASON", "false"
}

func die(err error) {
	fmt.Fprintln(os.Stderr, "faults_go:", err)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 5 {
		die(fmt.Errorf("usage: faults_go URL QUEUE N WAIT_MS"))
	}
	n, _ := strconv.Atoi(os.Args[3])
	waitMs, _ := strconv.Atoi(os.Args[4])
	cfg := amqp.Config{Properties: amqp.Table{"connection_name": "faults_go"}}
	if hb, err := strconv.Atoi(os.Getenv("FAULTS_HEARTBEAT")); err == nil { /* seconds */
		cfg.Heartbeat = time.Duration(hb) * time.Second
	}
	conn, err := amqp.DialConfig(os.Args[1], cfg)
	if err != nil {
		die(err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	ch, err := conn.Channel()
	if err != nil {
		die(err)
	}
	if err := ch.Confirm(false); err != nil {
		die(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n+1))
	res := result{Acks: []uint64{}, Nacks: []uint64{}, Missing: []uint64{}, ConfirmMs: map[string]float64{},
		Blocked: []string{}}
	bodyBytes, _ := strconv.Atoi(os.Getenv("FAULTS_BODY_BYTES"))
	sent := make(map[uint64]time.Time)
	for i := 1; i <= n; i++ {
		body := []byte(fmt.Sprintf("fault %d", i))
		if bodyBytes > 0 {
			body = make([]byte, bodyBytes)
			for k := range body {
				body[k] = byte((i + k) % 251)
			}
		}
		sent[uint64(i)] = time.Now()
		err := ch.Publish("", os.Args[2], true, false, amqp.Publishing{Body: body})
		if err != nil {
			break
		}
		res.Published = i
	}
	seen := make(map[uint64]bool)
	deadline := time.After(time.Duration(waitMs) * time.Millisecond)
loop:
	for len(seen) < res.Published || (n == 0 && closed != nil) { /* N 0: idle until closed or WAIT_MS */
		select {
		case c, ok := <-confirms:
			if !ok {
				break loop
			}
			seen[c.DeliveryTag] = true
			res.ConfirmMs[strconv.FormatUint(c.DeliveryTag, 10)] =
				float64(time.Since(sent[c.DeliveryTag]).Microseconds()) / 1000
			if c.Ack {
				res.Acks = append(res.Acks, c.DeliveryTag)
			} else {
				res.Nacks = append(res.Nacks, c.DeliveryTag)
			}
		case e := <-closed:
			if e != nil {
				res.Closed = fmt.Sprintf("%d %s", e.Code, e.Reason)
			} else {
				res.Closed = "closed"
			}
			closed = nil
		case b, ok := <-blocked:
			if !ok { /* closed with the connection */
				blocked = nil
				continue
			}
			res.Blocked = append(res.Blocked, strings.TrimSpace(fmt.Sprintf("%v %s", b.Active, b.Reason)))
		case <-deadline:
			break loop
		}
	}
	for drained := false; !drained; { /* an unblocked that came with the last confirm */
		select {
		case b, ok := <-blocked:
			if !ok {
				blocked, drained = nil, true
				continue
			}
			res.Blocked = append(res.Blocked, strings.TrimSpace(fmt.Sprintf("%v %s", b.Active, b.Reason)))
		case <-time.After(100 * time.Millisecond):
			drained = true
		}
	}
	for i := 1; i <= res.Published; i++ {
		if !seen[uint64(i)] {
			res.Missing = append(res.Missing, uint64(i))
		}
	}
	if res.Closed == "" {
		select {
		case e := <-closed:
			if e != nil {
				res.Closed = fmt.Sprintf("%d %s", e.Code, e.Reason)
			}
		default:
			conn.Close()
		}
	}
	line, _ := json.Marshal(res)
	fmt.Println(string(line))
}
