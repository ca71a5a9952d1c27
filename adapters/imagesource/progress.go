package imagesource

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

// report logs how far the download got every interval until stop: bytes
// so far, the rate over the last interval and over the whole download, and
// the share of total when it is known (> 0). Each line is stamped with the
// time it was decided on, and the next is not due before a whole interval
// after it (a timer re-armed per line, where a late ticker would send its
// next tick early), so lines are never closer than the interval. A download
// shorter than one interval logs nothing.
func (p *progress) report(log logrus.FieldLogger, total int64, every time.Duration) (stop func()) {
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		timer := time.NewTimer(every)
		defer timer.Stop()
		start, last, lastN := time.Now(), time.Now(), int64(0)
		for {
			select {
			case <-done:
				return
			case <-timer.C:
				now := time.Now()
				n := p.n.Load()
				f := logrus.Fields{"bytes": n, "MiBps": rate(n-lastN, now.Sub(last)), "averageMiBps": rate(n, now.Sub(start)),
					"seconds": now.Sub(start).Round(time.Millisecond).Seconds()}
				if total > 0 {
					f["total"], f["percent"] = total, 100*n/total
				}
				if n == lastN {
					f["stalled"] = true // nothing arrived for a whole interval
				}
				log.WithFields(f).WithTime(now).Info("downloading image")
				last, lastN = now, n
				timer.Reset(every - time.Since(now)) // due an interval after this line
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}
