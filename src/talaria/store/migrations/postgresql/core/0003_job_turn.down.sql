DROP TABLE job_turn;
