//! An OpenAI Chat Completions request turned into a prompt for the local model, and its answer
//! turned back into a Chat Completions response.
//!
//! Shapes are kept by grammars, never hoped for: `response_format` `json_schema` (or
//! `json_object`) constrains the answer to the schema. With `tools`, every answer is one JSON
//! object, `{"tool": NAME, "arguments": {...}}` (the arguments constrained by the tool's
//! parameter schema) or `{"answer": ...}`, and is returned as a tool call or as the content.

use serde_json::{Value, json};

use super::engine::{Finish, Generation, Params};

/// A request ready for the engine.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// (role, text), roles `system`, `user` and `assistant`.
    pub(crate) messages: Vec<(String, String)>,
    /// The JSON Schema the answer must match, turned into a grammar by the engine's side.
    pub(crate) schema: Option<Value>,
    pub(crate) params: Params,
    /// Whether answers are the tool envelope.
    pub(crate) tools: bool,
}

/// A request the local model cannot take, with the reason (an HTTP 400).
#[derive(Debug)]
pub(crate) struct BadRequest(pub(crate) String);

/// The text of a message's `content`: a string, or the text parts of a list.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The tools offered, as (name, description, parameters).
fn tools_of(body: &Value) -> Vec<(String, String, Value)> {
    body.get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    let function = t.get("function")?;
                    let name = function.get("name")?.as_str()?.to_owned();
                    let description = function
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let parameters = function
                        .get("parameters")
                        .cloned()
                        .unwrap_or_else(|| json!({"type": "object"}));
                    Some((name, description, parameters))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The schema of the answer `response_format` asks for, if any.
fn answer_schema(body: &Value) -> Result<Option<Value>, BadRequest> {
    let Some(format) = body.get("response_format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => format
            .pointer("/json_schema/schema")
            .cloned()
            .map(Some)
            .ok_or_else(|| BadRequest("response_format json_schema has no schema".into())),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("text") | None => Ok(None),
        Some(other) => Err(BadRequest(format!(
            "response_format type `{other}` is not supported"
        ))),
    }
}

/// Turns a Chat Completions body into messages, a schema and generation parameters.
pub(crate) fn prepare(body: &Value) -> Result<Prepared, BadRequest> {
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(BadRequest(
            "streaming is not supported by the local model".into(),
        ));
    }
    let answer = answer_schema(body)?;
    let tool_choice = body.get("tool_choice");
    let mut tools = tools_of(body);
    let mut answer_allowed = true;
    match tool_choice {
        Some(Value::String(choice)) if choice == "none" => tools.clear(),
        Some(Value::String(choice)) if choice == "required" => answer_allowed = false,
        Some(Value::Object(_)) => {
            if let Some(name) = tool_choice
                .and_then(|c| c.pointer("/function/name"))
                .and_then(Value::as_str)
            {
                tools.retain(|(n, _, _)| n == name);
                answer_allowed = false;
            }
        }
        _ => {}
    }
    let with_tools = !tools.is_empty();
    let mut system = Vec::new();
    let mut messages = Vec::new();
    // Tool call ids → names, to say which tool a result is from.
    let mut called = std::collections::HashMap::new();
    for message in body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| BadRequest("the request has no messages".into()))?
    {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("user");
        let text = text_of(message.get("content"));
        match role {
            "system" | "developer" => system.push(text),
            "assistant" => {
                let calls = message
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let mut parts = Vec::new();
                if !text.trim().is_empty() {
                    parts.push(if with_tools {
                        json!({"answer": text}).to_string()
                    } else {
                        text
                    });
                }
                for call in &calls {
                    let name = call
                        .pointer("/function/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let arguments = call
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .and_then(|a| serde_json::from_str::<Value>(a).ok())
                        .unwrap_or_else(|| json!({}));
                    if let Some(id) = call.get("id").and_then(Value::as_str) {
                        called.insert(id.to_owned(), name.to_owned());
                    }
                    parts.push(json!({"tool": name, "arguments": arguments}).to_string());
                }
                messages.push(("assistant".to_owned(), parts.join("\n")));
            }
            "tool" => {
                let name = message
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .and_then(|id| called.get(id))
                    .map_or("the tool", String::as_str);
                messages.push(("user".to_owned(), format!("Result of `{name}`:\n{text}")));
            }
            _ => messages.push(("user".to_owned(), text)),
        }
    }
    if with_tools {
        system.push(tools_prompt(&tools, answer.as_ref(), answer_allowed));
    } else if let Some(schema) = &answer {
        system.push(format!(
            "Answer with one JSON value that matches this JSON Schema:\n{schema}"
        ));
    }
    if !system.is_empty() {
        messages.insert(0, ("system".to_owned(), system.join("\n\n")));
    }
    let schema = if with_tools {
        Some(envelope(&tools, answer.as_ref(), answer_allowed))
    } else {
        answer
    };
    let max_tokens = body
        .get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
        .and_then(Value::as_u64)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    let stop = match body.get("stop") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    #[allow(clippy::cast_possible_truncation)]
    let temperature = body
        .get("temperature")
        .and_then(Value::as_f64)
        .map(|t| t as f32);
    let seed = body
        .get("seed")
        .and_then(Value::as_u64)
        .map_or(0, |s| (s & u64::from(u32::MAX)) as u32);
    Ok(Prepared {
        messages,
        schema,
        params: Params {
            grammar: None,
            max_tokens,
            stop,
            temperature,
            seed,
        },
        tools: with_tools,
    })
}

/// The system prompt's part that offers the tools and says how to answer.
fn tools_prompt(
    tools: &[(String, String, Value)],
    answer: Option<&Value>,
    answer_allowed: bool,
) -> String {
    let mut text = String::new();
    if answer_allowed {
        match answer {
            Some(schema) => text.push_str(&format!(
                "Reply with only a JSON object. To answer, reply {{\"answer\": ANSWER}}, where \
                 ANSWER matches this JSON Schema:\n{schema}\n"
            )),
            None => text.push_str(
                "Reply with only a JSON object. To answer, reply {\"answer\": \"your answer\"}.\n",
            ),
        }
        text.push_str("Only when you need a tool's result first, ");
    } else {
        text.push_str("Reply with only a JSON object: ");
    }
    text.push_str(
        "call the tool with {\"tool\": \"NAME\", \"arguments\": {...}}; its result comes back \
         in the next message.",
    );
    text.push_str("\n\nTools:");
    for (name, description, parameters) in tools {
        text.push_str(&format!(
            "\n- {name}: {description}\n  arguments (JSON Schema): {parameters}"
        ));
    }
    text
}

/// The schema every answer with tools matches: one of the tool calls, or the answer.
pub(crate) fn envelope(
    tools: &[(String, String, Value)],
    answer: Option<&Value>,
    answer_allowed: bool,
) -> Value {
    let mut choices: Vec<Value> = Vec::new();
    if answer_allowed {
        let answer = answer.cloned().unwrap_or_else(|| json!({"type": "string"}));
        choices.push(json!({
            "type": "object",
            "properties": {"answer": answer},
            "required": ["answer"],
            "additionalProperties": false,
        }));
    }
    choices.extend(tools.iter().map(|(name, _, parameters)| {
        json!({
            "type": "object",
            "properties": {"tool": {"const": name}, "arguments": parameters},
            "required": ["tool", "arguments"],
            "additionalProperties": false,
        })
    }));
    match <[Value; 1]>::try_from(choices) {
        Ok([one]) => one,
        Err(choices) => json!({"anyOf": choices}),
    }
}

/// The Chat Completions response for `generation` (`tools`: it is the tool envelope).
pub(crate) fn respond(model: &str, generation: &Generation, tools: bool, id: u64) -> Value {
    let mut finish = match generation.finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
    };
    let mut content = Value::String(generation.text.clone());
    let mut tool_calls = Value::Null;
    if tools && generation.finish == Finish::Stop {
        match serde_json::from_str::<Value>(&generation.text) {
            Ok(Value::Object(map)) if map.contains_key("tool") => {
                let name = map.get("tool").and_then(Value::as_str).unwrap_or_default();
                let arguments = map.get("arguments").cloned().unwrap_or_else(|| json!({}));
                tool_calls = json!([{
                    "id": format!("call_{id}_0"),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments.to_string()},
                }]);
                content = Value::Null;
                finish = "tool_calls";
            }
            Ok(Value::Object(map)) if map.contains_key("answer") => {
                content = match &map["answer"] {
                    Value::String(text) => Value::String(text.clone()),
                    other => Value::String(other.to_string()),
                };
            }
            _ => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": content});
    if !tool_calls.is_null() {
        message["tool_calls"] = tool_calls;
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "id": format!("chatcmpl-local-{id}"),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.completion_tokens,
            "total_tokens": generation.prompt_tokens + generation.completion_tokens,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Value {
        json!([{"type": "function", "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        }}])
    }

    #[test]
    fn a_schema_answer_is_asked_for_and_held_to_the_schema() {
        let schema = json!({"type": "object", "properties": {"a": {"enum": ["x", "y"]}}});
        let prepared = prepare(&json!({
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
            "max_tokens": 7,
            "stop": "END",
        }))
        .expect("prepared");
        assert_eq!(prepared.schema, Some(schema.clone()));
        assert!(!prepared.tools);
        assert_eq!(prepared.messages[0].0, "system");
        assert!(
            prepared.messages[0]
                .1
                .starts_with("Be brief.\n\nAnswer with one JSON value")
        );
        assert!(prepared.messages[0].1.contains(&schema.to_string()));
        assert_eq!(prepared.messages[1], ("user".to_owned(), "Hi".to_owned()));
        assert_eq!(prepared.params.max_tokens, Some(7));
        assert_eq!(prepared.params.stop, ["END"]);
    }

    #[test]
    fn with_tools_every_answer_is_a_call_or_the_answer() {
        let prepared = prepare(&json!({
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Read a"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "alpha"},
            ],
            "tools": tools(),
        }))
        .expect("prepared");
        assert!(prepared.tools);
        let schema = prepared.schema.expect("the envelope");
        let choices = schema["anyOf"].as_array().expect("a choice");
        assert_eq!(
            choices[0]["properties"]["answer"],
            json!({"type": "string"})
        );
        assert_eq!(
            choices[1]["properties"]["tool"],
            json!({"const": "read_file"})
        );
        assert_eq!(
            prepared.messages[2],
            (
                "assistant".to_owned(),
                r#"{"tool":"read_file","arguments":{"path":"a"}}"#.to_owned()
            )
        );
        assert_eq!(
            prepared.messages[3],
            (
                "user".to_owned(),
                "Result of `read_file`:\nalpha".to_owned()
            )
        );
        // `required` leaves only the calls; `none` leaves no tools at all.
        let required = prepare(&json!({
            "messages": [{"role": "user", "content": "x"}], "tools": tools(), "tool_choice": "required",
        }))
        .expect("prepared");
        assert_eq!(
            required.schema.expect("schema")["properties"]["tool"]["const"],
            "read_file"
        );
        let none = prepare(&json!({
            "messages": [{"role": "user", "content": "x"}], "tools": tools(), "tool_choice": "none",
        }))
        .expect("prepared");
        assert!(!none.tools && none.schema.is_none());
    }

    fn generation(text: &str, finish: Finish) -> Generation {
        Generation {
            text: text.to_owned(),
            prompt_tokens: 10,
            completion_tokens: 4,
            finish,
        }
    }

    #[test]
    fn the_envelope_comes_back_as_a_tool_call_or_as_content() {
        let call = respond(
            "m",
            &generation(
                r#"{"tool": "read_file", "arguments": {"path": "a"}}"#,
                Finish::Stop,
            ),
            true,
            3,
        );
        let choice = &call["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], Value::Null);
        assert_eq!(
            choice["message"]["tool_calls"][0]["function"]["name"],
            "read_file"
        );
        assert_eq!(
            choice["message"]["tool_calls"][0]["function"]["arguments"],
            r#"{"path":"a"}"#
        );
        assert_eq!(call["usage"]["total_tokens"], 14);
        let answer = respond(
            "m",
            &generation(r#"{"answer": "done"}"#, Finish::Stop),
            true,
            4,
        );
        assert_eq!(answer["choices"][0]["message"]["content"], "done");
        assert_eq!(answer["choices"][0]["finish_reason"], "stop");
        let cut = respond(
            "m",
            &generation(r#"{"answer": "do"#, Finish::Length),
            true,
            5,
        );
        assert_eq!(cut["choices"][0]["finish_reason"], "length");
        assert_eq!(cut["choices"][0]["message"]["content"], r#"{"answer": "do"#);
    }

    #[test]
    fn streaming_and_unknown_formats_are_refused() {
        let stream = prepare(&json!({"messages": [], "stream": true})).expect_err("stream");
        assert!(stream.0.contains("streaming"));
        let format = prepare(&json!({"messages": [], "response_format": {"type": "grammar"}}))
            .expect_err("format");
        assert_eq!(format.0, "response_format type `grammar` is not supported");
    }
}
