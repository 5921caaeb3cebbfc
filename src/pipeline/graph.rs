//! The dependency graph of a pipeline's steps: what each step waits for (the steps its
//! templates reference, its `needs`, its `over`), the order steps may run in, which are ready,
//! and whose per-item results a later template reads.

use std::collections::{HashMap, VecDeque};

use super::model::{Decompose, OutputBody, Pipeline, Step, StepKind, TaskTemplate, Template};
use super::refs;

/// Steps as nodes, "needs" as edges (`deps`), and the reverse edges (`dependents`).
#[derive(Debug, Clone)]
pub(crate) struct Graph {
    deps: Vec<Vec<usize>>,
    dependents: Vec<Vec<usize>>,
    order: Vec<usize>,
    results_needed: Vec<bool>,
    items_needed: Vec<bool>,
    /// Each step's index by id (the first of duplicate ids).
    ids: HashMap<String, usize>,
}

/// The `steps.<id>` references of a template text: each id and the byte offset of the id.
pub(crate) fn referenced_steps(template_text: &str) -> Vec<(String, usize)> {
    refs::step_refs(template_text)
        .into_iter()
        .map(|r| (r.id, r.offset))
        .collect()
}

/// Every template of a step, in file order of the keys that hold them.
pub(crate) fn step_templates(step: &Step) -> Vec<&Template> {
    match &step.kind {
        StepKind::Decompose(Decompose::Static(_, t)) => vec![t],
        StepKind::Decompose(Decompose::Items(_)) => Vec::new(),
        StepKind::Decompose(Decompose::Agent(task))
        | StepKind::Synthesize(task)
        | StepKind::Delegate(task) => task_templates(task),
        StepKind::FanOut(fan_out) => task_templates(&fan_out.task),
    }
}

fn task_templates(task: &TaskTemplate) -> Vec<&Template> {
    let mut out: Vec<&Template> = Vec::new();
    out.extend(&task.source);
    out.extend(&task.instructions);
    out.extend(task.parameters.values());
    out.extend(&task.context);
    out
}

/// The templates of the pipeline's `outputs`.
pub(crate) fn output_templates(pipeline: &Pipeline) -> Vec<&Template> {
    pipeline
        .outputs
        .iter()
        .flat_map(|o| match &o.body {
            OutputBody::Text(content) => vec![&o.path, content],
            OutputBody::Table(_) => vec![&o.path],
        })
        .collect()
}

impl Graph {
    /// Builds the graph. References to unknown steps and a step's references to itself are
    /// left out (validation reports them); a template that uses `steps` without naming a step
    /// (`{% for s in steps %}`) depends on every step written above it.
    pub(crate) fn new(pipeline: &Pipeline) -> Self {
        let n = pipeline.steps.len();
        let index: HashMap<&str, usize> = pipeline
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.as_str(), i))
            .rev() // the first of duplicate ids wins
            .collect();
        let mut deps: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut results_needed = vec![false; n];
        let mut items_needed = vec![false; n];
        let mut note_uses = |templates: Vec<&Template>, limit: usize, deps: &mut Vec<usize>| {
            for template in templates {
                for r in refs::step_refs(&template.text) {
                    if let Some(&j) = index.get(r.id.as_str()) {
                        deps.push(j);
                        match r.field.as_deref() {
                            Some("items") => items_needed[j] = true,
                            // The whole step, its items with the rest.
                            None => {
                                items_needed[j] = true;
                                results_needed[j] = true;
                            }
                            Some(_) => results_needed[j] = true,
                        }
                    }
                }
                if !refs::whole_steps_uses(&template.text).is_empty() {
                    deps.extend(0..limit);
                    results_needed[..limit].iter_mut().for_each(|r| *r = true);
                    items_needed[..limit].iter_mut().for_each(|r| *r = true);
                }
            }
        };
        for (i, step) in pipeline.steps.iter().enumerate() {
            let mut step_deps = Vec::new();
            note_uses(step_templates(step), i, &mut step_deps);
            step_deps.extend(
                step.needs
                    .iter()
                    .filter_map(|(id, _)| index.get(id.as_str()).copied()),
            );
            if let StepKind::FanOut(fan_out) = &step.kind
                && let Some(j) = fan_out.over_step
            {
                step_deps.push(j);
            }
            step_deps.retain(|&j| j != i);
            step_deps.sort_unstable();
            step_deps.dedup();
            deps[i] = step_deps;
        }
        let mut unused = Vec::new();
        note_uses(output_templates(pipeline), n, &mut unused);
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, ds) in deps.iter().enumerate() {
            for &j in ds {
                dependents[j].push(i);
            }
        }
        let order = topological_order(&deps, &dependents);
        Self {
            deps,
            dependents,
            order,
            results_needed,
            items_needed,
            ids: index
                .into_iter()
                .map(|(id, i)| (id.to_owned(), i))
                .collect(),
        }
    }

    /// The steps that step `step` waits for, ascending.
    pub(crate) fn deps(&self, step: usize) -> &[usize] {
        &self.deps[step]
    }

    /// The steps that wait for step `step`, ascending.
    #[cfg(test)]
    pub(crate) fn dependents(&self, step: usize) -> &[usize] {
        &self.dependents[step]
    }

    /// Every step, each after the steps it waits for; among steps free to go, file order
    /// first. Steps on a dependency cycle are missing (validation rejects cycles).
    pub(crate) fn order(&self) -> &[usize] {
        &self.order
    }

    /// The steps not yet started whose dependencies are all done, in file order.
    pub(crate) fn ready(&self, done: &[bool], started: &[bool]) -> Vec<usize> {
        (0..self.deps.len())
            .filter(|&i| !started.get(i).copied().unwrap_or(false))
            .filter(|&i| !done.get(i).copied().unwrap_or(false))
            .filter(|&i| {
                self.deps[i]
                    .iter()
                    .all(|&j| done.get(j).copied().unwrap_or(false))
            })
            .collect()
    }

    /// Whether a template (of a step or of `outputs`) reads this step's `output` or `results`
    /// (anything but `items`): if not, the runner need not keep its results in memory.
    pub(crate) fn results_needed(&self, step: usize) -> bool {
        self.results_needed[step]
    }

    /// Whether a template (of a step or of `outputs`) reads this step's `items`: if not, a
    /// decompose step's file is streamed to its fan-out rather than read into memory.
    pub(crate) fn items_needed(&self, step: usize) -> bool {
        self.items_needed[step]
    }

    /// [`Self::items_needed`] of the step with this id (`false`: no such step).
    pub(crate) fn items_needed_by(&self, id: &str) -> bool {
        self.ids.get(id).is_some_and(|&i| self.items_needed[i])
    }

    /// The dependency cycles, one per group of steps that wait for each other: each starts and
    /// ends at its first step in file order (`[a, b, a]`: `a` needs `b`, `b` needs `a`).
    pub(crate) fn cycles(&self) -> Vec<Vec<usize>> {
        let n = self.deps.len();
        let mut reported = vec![false; n];
        let mut out = Vec::new();
        for start in 0..n {
            if reported[start] {
                continue;
            }
            let Some(cycle) = self.shortest_cycle(start) else {
                continue;
            };
            // the whole group: steps reachable from `start` that reach it back
            let forward = reach(start, &self.deps);
            let backward = reach(start, &self.dependents);
            for i in 0..n {
                if forward[i] && backward[i] {
                    reported[i] = true;
                }
            }
            out.push(cycle);
        }
        out
    }

    /// The shortest path `start -> ... -> start` along dependencies (breadth first).
    fn shortest_cycle(&self, start: usize) -> Option<Vec<usize>> {
        let n = self.deps.len();
        let mut parent: Vec<Option<usize>> = vec![None; n];
        let mut seen = vec![false; n];
        seen[start] = true;
        let mut queue = VecDeque::from([start]);
        while let Some(node) = queue.pop_front() {
            for &next in &self.deps[node] {
                if next == start {
                    let mut path = vec![node];
                    let mut at = node;
                    while at != start {
                        at = parent[at].unwrap_or(start);
                        path.push(at);
                    }
                    path.reverse();
                    path.push(start);
                    return Some(path);
                }
                if !seen[next] {
                    seen[next] = true;
                    parent[next] = Some(node);
                    queue.push_back(next);
                }
            }
        }
        None
    }
}

/// Which nodes `start` reaches along `edges` (itself excluded unless on a cycle).
fn reach(start: usize, edges: &[Vec<usize>]) -> Vec<bool> {
    let mut seen = vec![false; edges.len()];
    let mut stack = edges[start].clone();
    while let Some(node) = stack.pop() {
        if !seen[node] {
            seen[node] = true;
            stack.extend(&edges[node]);
        }
    }
    seen
}

/// Kahn's algorithm, taking the lowest ready index first.
fn topological_order(deps: &[Vec<usize>], dependents: &[Vec<usize>]) -> Vec<usize> {
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut ready: std::collections::BTreeSet<usize> =
        (0..deps.len()).filter(|&i| waiting[i] == 0).collect();
    let mut order = Vec::with_capacity(deps.len());
    while let Some(next) = ready.pop_first() {
        order.push(next);
        for &d in &dependents[next] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.insert(d);
            }
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::parse::tests::{SPEC_EXAMPLE, read_unchecked};

    /// A pipeline of `delegate` steps, one per `(id, instructions, needs)`.
    fn pipeline(steps: &[(&str, &str, &[&str])]) -> Pipeline {
        let mut text = String::from("version: 1\nsteps:\n");
        for (id, instructions, needs) in steps {
            text.push_str(&format!(
                "  - id: {id}\n    delegate: {{instructions: {instructions:?}}}\n    needs: {needs:?}\n"
            ));
        }
        read_unchecked(&text)
    }

    fn deps_of(graph: &Graph, n: usize) -> Vec<Vec<usize>> {
        (0..n).map(|i| graph.deps(i).to_vec()).collect()
    }

    #[test]
    fn the_spec_example() {
        let p = read_unchecked(SPEC_EXAMPLE);
        let g = Graph::new(&p);
        assert_eq!(deps_of(&g, 3), [vec![], vec![0], vec![1]]);
        assert_eq!(g.dependents(0), [1]);
        assert_eq!(g.dependents(1), [2]);
        assert!(g.dependents(2).is_empty());
        assert_eq!(g.order(), [0, 1, 2]);
        assert!(g.cycles().is_empty());
        // `over` reads items only; the fan_out's results and the synthesis are read
        assert_eq!(
            (0..3).map(|i| g.results_needed(i)).collect::<Vec<_>>(),
            [false, true, true]
        );
    }

    #[test]
    fn dependencies_come_from_references_needs_and_over() {
        let p = pipeline(&[
            (
                "late",
                "{{ steps.first.output }} {{ steps['mid'].output }}",
                &[],
            ),
            ("first", "x", &[]),
            ("mid", "y", &["first"]),
            (
                "solo",
                "{{ steps.solo.output }} {{ steps.ghost.output }}",
                &[],
            ),
            ("all", "{% for s in steps %}{% endfor %}", &[]),
        ]);
        let g = Graph::new(&p);
        // self references and unknown steps are left to validation
        assert_eq!(
            deps_of(&g, 5),
            [vec![1, 2], vec![], vec![1], vec![], vec![0, 1, 2, 3]]
        );
        assert_eq!(g.dependents(1), [0, 2, 4]);
        assert_eq!(g.order(), [1, 2, 0, 3, 4]);
        assert!(g.results_needed(0), "read as a whole by `all`");
    }

    #[test]
    fn ready_sets() {
        // a → b, a → c, (b, c) → d, e alone
        let p = pipeline(&[
            ("a", "x", &[]),
            ("b", "{{ steps.a.output }}", &[]),
            ("c", "{{ steps.a.output }}", &[]),
            ("d", "{{ steps.b.output }}{{ steps.c.output }}", &[]),
            ("e", "x", &[]),
        ]);
        let g = Graph::new(&p);
        let set = |bits: &[usize]| {
            let mut v = vec![false; 5];
            for &i in bits {
                v[i] = true;
            }
            v
        };
        // (done, started, ready)
        let cases: &[(&[usize], &[usize], &[usize])] = &[
            (&[], &[], &[0, 4]),
            (&[], &[0, 4], &[]),
            (&[0], &[0], &[1, 2, 4]),
            (&[0, 4], &[0, 1, 4], &[2]),
            (&[0, 1], &[0, 1, 2], &[4]),
            (&[0, 1, 2], &[0, 1, 2, 4], &[3]),
            (&[0, 1, 2, 3, 4], &[0, 1, 2, 3, 4], &[]),
        ];
        for (done, started, ready) in cases {
            assert_eq!(
                g.ready(&set(done), &set(started)),
                *ready,
                "done {done:?} started {started:?}"
            );
        }
        assert_eq!(g.order(), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn cycles_are_named_from_their_first_step() {
        let p = pipeline(&[
            ("free", "x", &[]),
            ("a", "{{ steps.b.output }}", &[]),
            ("b", "x", &["c"]),
            ("c", "{{ steps.a.output }}", &[]),
            ("d", "{{ steps.e.output }}", &[]),
            ("e", "{{ steps.d.output }}", &["a"]),
            ("after", "{{ steps.free.output }}", &[]),
        ]);
        let g = Graph::new(&p);
        assert_eq!(g.cycles(), [vec![1, 2, 3, 1], vec![4, 5, 4]]);
        // steps on or behind a cycle never become ready
        assert_eq!(g.order(), [0, 6]);
        let none = vec![false; 7];
        assert_eq!(g.ready(&none, &none), [0]);
    }

    #[test]
    fn the_shortest_cycle_is_named() {
        // a needs b and c; c needs a directly, b needs a through d
        let p = pipeline(&[
            ("a", "{{ steps.b.items }}{{ steps.c.items }}", &[]),
            ("b", "{{ steps.d.items }}", &[]),
            ("c", "{{ steps.a.items }}", &[]),
            ("d", "{{ steps.a.items }}", &[]),
        ]);
        assert_eq!(Graph::new(&p).cycles(), [vec![0, 2, 0]]);
    }

    #[test]
    fn results_needed_only_when_output_or_results_are_read() {
        let text = "version: 1
steps:
  - id: list
    decompose: {items: [1, 2]}
  - id: each
    fan_out: {over: list, instructions: \"{{ item }}\"}
  - id: count
    delegate: {instructions: \"{{ steps.list.items | length }} {{ steps.each['items'] }}\"}
  - id: last
    delegate: {instructions: \"{{ steps.count }}\"}
outputs:
  - {path: \"{{ steps.last.output }}.md\", content: x}
";
        let g = Graph::new(&read_unchecked(text));
        assert_eq!(
            (0..4).map(|i| g.results_needed(i)).collect::<Vec<_>>(),
            [false, false, true, true]
        );
    }

    #[test]
    fn referenced_steps_give_ids_and_offsets() {
        assert_eq!(
            referenced_steps("{{ steps.a.output }} {{ steps[\"b\"] }} steps.c"),
            [("a".to_owned(), 9), ("b".to_owned(), 31)]
        );
    }
}
