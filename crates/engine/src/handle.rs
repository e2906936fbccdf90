//! The engine on its own thread: requests go in through a channel, events come back on one
//! channel per request. Dropping a request's receiver cancels it within a step.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::request::{Event, RequestSpec};

enum Command {
    Submit(RequestSpec, tokio::sync::mpsc::UnboundedSender<Event>),
}

/// A running engine loop. Cloning shares it; the loop ends when every handle is dropped and no
/// request is left.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    pub metrics: Arc<Metrics>,
    thread: Arc<JoinHandle<()>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineStopped;

impl std::fmt::Display for EngineStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the engine has stopped")
    }
}

impl std::error::Error for EngineStopped {}

impl EngineHandle {
    /// Starts `engine`'s loop on a new thread.
    pub fn spawn(engine: Engine, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("vortex-engine".into())
            .spawn(move || run(engine, rx))
            .expect("spawning the engine thread");
        Self {
            tx,
            metrics,
            thread: Arc::new(thread),
        }
    }

    /// Whether the loop still runs (it ends only when every handle is gone, or on a panic).
    pub fn is_running(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Queues a request; its events arrive on the returned receiver.
    pub fn submit(&self, spec: RequestSpec) -> Result<UnboundedReceiver<Event>, EngineStopped> {
        let (etx, erx) = unbounded_channel();
        self.tx
            .send(Command::Submit(spec, etx))
            .map_err(|_| EngineStopped)?;
        Ok(erx)
    }
}

fn run(mut engine: Engine, rx: Receiver<Command>) {
    let mut open = true;
    loop {
        if let Some(why) = engine.lost() {
            // Ending the loop closes the channel: submissions and the health check then say
            // the engine has stopped.
            eprintln!("engine stopped: {why}");
            // Requests still queued get their answer rather than a closed channel.
            while let Ok(Command::Submit(_, events)) = rx.try_recv() {
                let _ = events.send(Event::Failed(format!("the engine has stopped: {why}")));
            }
            return;
        }
        if engine.is_idle() {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(cmd) => handle(&mut engine, cmd),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => handle(&mut engine, cmd),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if !engine.step() && !engine.is_idle() {
            // Requests wait for something other than compute (e.g. a client going away):
            // sleep briefly instead of spinning.
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(cmd) => handle(&mut engine, cmd),
                Err(RecvTimeoutError::Disconnected) => open = false,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

fn handle(engine: &mut Engine, cmd: Command) {
    match cmd {
        Command::Submit(spec, events) => engine.submit(spec, events),
    }
}
