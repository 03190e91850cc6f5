module intentkv

go 1.19
