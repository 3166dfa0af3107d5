DROP TABLE runner_tool_call;
DROP TABLE runner_grant;
DROP TABLE runner_event;
DROP TABLE runner_gateway;
