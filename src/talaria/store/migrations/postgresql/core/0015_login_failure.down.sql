DROP TABLE login_failure;
