package images

import (
	"io"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
)

// progress counts a download's bytes as they arrive. It counts at the
// reader, not after the copy's writes: the copy reads 256 KiB chunks, which
// a slow server takes long to fill, and a stalled download writes nothing
// at all, yet both should show in the log.
type progress struct {
	r io.Reader
	n atomic.Int64
}

func (p *progress) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n.Add(int64(n))
	return n, err
}

// report logs how far the download got every interval (so at most once an
// interval) until stop: bytes so far, the rate over the last interval and
// over the whole download, and the share of total when it is known (> 0).
// A download shorter than one interval logs nothing.
func (p *progress) report(log logrus.FieldLogger, total int64, every time.Duration) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(every)
		defer tick.Stop()
		start, last, lastN := time.Now(), time.Now(), int64(0)
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				n := p.n.Load()
				f := logrus.Fields{"bytes": n, "MiBps": rate(n-lastN, now.Sub(last)), "averageMiBps": rate(n, now.Sub(start)),
					"seconds": now.Sub(start).Round(time.Millisecond).Seconds()}
				if total > 0 {
					f["total"], f["percent"] = total, 100*n/total
				}
				if n == lastN {
					f["stalled"] = true // nothing arrived for a whole interval
				}
				log.WithFields(f).Info("downloading image")
				last, lastN = now, n
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}
