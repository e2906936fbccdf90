//! One progress line on stderr while a level runs: redrawn in place on a terminal, printed every
//! few seconds otherwise (logs, CI).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub struct Progress {
    label: String,
    total: usize,
    start: Instant,
    tty: bool,
    sent: AtomicUsize,
    done: AtomicUsize,
    errors: AtomicUsize,
}

impl Progress {
    pub fn new(label: String, total: usize) -> Progress {
        Progress {
            label,
            total,
            start: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            sent: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            errors: AtomicUsize::new(0),
        }
    }

    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    pub fn finished(&self, ok: bool) {
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    fn line(&self) -> String {
        let done = self.done.load(Ordering::Relaxed);
        let sent = self.sent.load(Ordering::Relaxed);
        format!(
            "{}: {done}/{} done, {} errors, {} in flight, {:.1}s",
            self.label,
            self.total,
            self.errors.load(Ordering::Relaxed),
            sent.saturating_sub(done),
            self.start.elapsed().as_secs_f64()
        )
    }

    /// Redraws until the task is aborted.
    pub async fn run(&self) {
        let period = if self.tty {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(5)
        };
        let mut tick = tokio::time::interval(period);
        tick.tick().await;
        loop {
            tick.tick().await;
            let mut err = std::io::stderr().lock();
            if self.tty {
                let _ = write!(err, "\r\x1b[2K{}", self.line());
            } else {
                let _ = writeln!(err, "{}", self.line());
            }
            let _ = err.flush();
        }
    }

    /// Ends the progress output: a terminal's live line is erased (the table row follows), a
    /// log gets the final count.
    pub fn close(&self) {
        let mut err = std::io::stderr().lock();
        let _ = if self.tty {
            write!(err, "\r\x1b[2K")
        } else {
            writeln!(err, "{}", self.line())
        };
        let _ = err.flush();
    }
}
