//! A request's flow: bound to a loaded one, loading it the first time a request asks for it.

use vortex_flow::runner::FlowRunner;
use vortex_kv::Sequence;

use super::Engine;
use crate::active::Active;
use crate::request::FlowChoice;

impl Engine {
    /// Resolves the request's flow to a loaded one, loading it the first time it is asked for.
    pub(super) fn bind_flow(&mut self, a: &mut Active) -> Result<(), String> {
        let (name, index) = match &a.spec.flow {
            None => (self.flows[0].clone(), 0),
            Some(choice) => match self.flows.iter().position(|n| *n == choice.name) {
                Some(i) => (choice.name.clone(), i),
                None => (choice.name.clone(), self.load_flow(choice)?),
            },
        };
        let (runner, _) = self.kv.flow_at(index).ok_or("flow index out of range")?;
        a.state = runner.new_state(self.model.model.config.layers);
        a.state.flow = index;
        a.flow = (name, index);
        Ok(())
    }

    /// Loads flows requests may choose before any request runs (on a device, so that their
    /// summaries have memory set aside before the KV pool takes it).
    pub fn load_flows(&mut self, flows: &[FlowChoice]) -> Result<(), String> {
        for choice in flows {
            if !self.flows.contains(&choice.name) {
                self.load_flow(choice)?;
            }
        }
        Ok(())
    }

    /// Loads `choice` beside the loaded flows, summarising every complete page that could be
    /// attended; returns its index.
    pub(super) fn load_flow(&mut self, choice: &FlowChoice) -> Result<usize, String> {
        if let Some((_, why)) = self.unloadable.iter().find(|u| u.0 == choice.name) {
            return Err(why.clone());
        }
        let p = self.kv.cache.geometry().page_size;
        let cached = Sequence {
            pages: self.prefix.pages().collect(),
            len: self.prefix.len() * p,
        };
        let mut seqs: Vec<&Sequence> = self.running.iter().map(|r| &r.seq).collect();
        seqs.push(&cached);
        if let Err(why) = self.pass.load_flow(&choice.flow, &seqs) {
            self.unloadable.push((choice.name.clone(), why.clone()));
            return Err(why);
        }
        let i = self
            .kv
            .add_flow(FlowRunner::new(choice.flow.clone()), &seqs);
        self.flows.push(choice.name.clone());
        Ok(i)
    }
}
